"""Beam transforms: ``WriteToSupertable`` and ``ReadFromSupertable``.

``WriteToSupertable`` is a two-stage write in the manner of Beam's
``WriteToFiles``: workers build and upload superfiles under fresh names in
parallel, then one step commits their manifest entries as one OCC commit
whose idempotency token comes from the job and the window/firing, so a
retried bundle or a rerun of the same job never commits twice. Superfiles of
failed attempts are orphans that ``Supertable.vacuum`` reclaims.

Tokens and runs. Without a ``job_id`` the token starts with a run id drawn
each time the pipeline is serialized to run (``Pipeline.run``): every run of
one pipeline object, and every pipeline the transform is applied in, commits
afresh, while every worker, retried bundle and runner restart of one run sees
the same id (it travels inside the job's graph). A value computed inside the
pipeline (a ``Create | Map(uuid4)`` side input) would not do: a runner that
restarts a failed batch job from scratch, as Flink does, would compute a new
one and commit the rows again. A token that already landed is honoured only
for the same rows (``manifest.commit_fingerprint``); other rows under a
landed token fail the pipeline with ``TokenReuseError``.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Literal, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.utils.windowed_value import WindowedValue

from beam_supertable.errors import (
    CommitConflictError, CommitFailedError, SchemaMismatchError, SupertableError,
    TableExistsError)
from beam_supertable.manifest import CommitRequest, Manifest
from beam_supertable.schema import ID, conform
from beam_supertable.store import ObjectStore
from beam_supertable.superfile import vectors_of
from beam_supertable.filters import pruned
from beam_supertable.table import Supertable
from beam_supertable.vector import grid as grid_mod
from beam_supertable.writer import TARGET_SUPERFILE_BYTES, build_and_upload

__all__ = ["CommitResult", "ReadFromSupertable", "WriteResult", "WriteToSupertable"]

Metric = Literal["l2", "cosine", "dot"]
METRICS = ("l2", "cosine", "dot")
OnInvalid = Literal["dead_letter", "fail"]
ON_INVALID = ("dead_letter", "fail")

_LOG = logging.getLogger(__name__)
NAMESPACE = "beam_supertable"
INVALID_TAG = "invalid"
DEFAULT_BATCH_ROWS = 4096
DEFAULT_GRID_SAMPLE_ROWS = 50_000
DEFAULT_COMMIT_EVERY_S = 60
DEFAULT_STREAMING_SHARDS = 2     # superfiles per firing when the input size is unknown
FAIL_FIRST_ENV = "BEAM_SUPERTABLE_FAIL_FIRST"   # test hook: "<dir>:<stage>[,<stage>]"
FLOOR_REFRESH_S = 30             # unbounded input: how stale a part's version floor may be


class CommitResult(NamedTuple):
    """One commit of ``WriteToSupertable``.

    ``deduplicated`` is True when the commit's token had already landed with
    the same rows (a retried bundle, or a rerun of a job with a stable
    ``job_id``): ``version`` is where they landed and nothing new was committed.
    """

    version: int
    rows: int
    superfiles: int
    deduplicated: bool = False


class _RunScope:
    """The id of one run, shared by ``WriteToSupertable`` and its DoFns.

    ``WriteToSupertable.to_runner_api`` draws a new id each time the pipeline
    is serialized to run, before the DoFns that hold this object are pickled
    into the same job graph; workers unpickle it and never change it.
    """

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex

    def renew(self) -> None:
        self.run = uuid.uuid4().hex


def _fail_first_attempt(stage: str, key: str) -> None:
    """Test hook: the first attempt of a stage fails after its side effects.

    Set ``BEAM_SUPERTABLE_FAIL_FIRST=<dir>:build,commit``; each (stage, key)
    fails once, remembered by a marker file in ``<dir>`` (shared by processes).
    """
    spec = os.environ.get(FAIL_FIRST_ENV)
    if not spec:
        return
    folder, _, stages = spec.rpartition(":")
    if stage not in stages.split(","):
        return
    marker = os.path.join(folder, f"{stage}-{key}".replace("/", "_"))
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise RuntimeError(f"injected failure: first attempt of {stage} {key}")


def _open_or_create(uri, schema, vector_column, metric, fts_columns, n_cells, storage_options,
                    replica_factor) -> Supertable:
    """The table at ``uri``, created when absent; settings given must match an existing one."""
    try:
        table = Supertable.open(uri, storage_options=storage_options)
    except FileNotFoundError:
        if schema is None:
            raise ValueError(
                f"WriteToSupertable: no table at {uri!r} and no schema to create one; "
                "pass schema=pyarrow.schema([...])") from None
        try:
            return Supertable.create(uri, schema, vector_column=vector_column,
                                     metric=metric or "l2", fts_columns=fts_columns or (),
                                     n_cells=n_cells, storage_options=storage_options,
                                     replica_factor=replica_factor or 0.0)
        except TableExistsError:
            table = Supertable.open(uri, storage_options=storage_options)
    if schema is not None and not schema.equals(table.user_schema):
        raise SchemaMismatchError(
            f"WriteToSupertable: schema does not match the table at {uri!r}.\n"
            f"received:\n{schema}\nthe table has:\n{table.user_schema}")
    vp = table.properties.get("vector") or {}
    fp = table.properties.get("fts") or {}
    held = {"metric": vp.get("metric"), "fts_columns": tuple(fp.get("columns", ())),
            "n_cells": vp.get("n_cells"), "replica_factor": vp.get("replica_factor", 0.0)}
    given = {"metric": metric, "n_cells": n_cells, "replica_factor": replica_factor,
             "fts_columns": None if fts_columns is None else tuple(fts_columns)}
    differ = [f"{name}={value!r} (the table has {held[name]!r})"
              for name, value in given.items() if value is not None and value != held[name]]
    if differ:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {uri!r} was created with other settings: "
            f"{', '.join(differ)}; these settings apply only when the table is created")
    return table


class _ToBatches(beam.DoFn):
    """A list of rows (dicts) or RecordBatches -> conformed Arrow tables.

    Rows that do not fit go to ``invalid`` with the reason (or fail the job
    with ``on_invalid="fail"``); the others go on.
    """

    def __init__(self, uri, storage_options, on_invalid):
        self._uri, self._options, self._on_invalid = uri, storage_options, on_invalid

    def setup(self):
        table = Supertable.open(self._uri, storage_options=self._options)
        self._schema = table.user_schema
        self._names = frozenset(self._schema.names)
        vp = table.properties.get("vector")
        self._vector = vp["column"] if vp else None
        self._invalid = Metrics.counter(NAMESPACE, "invalid_rows")

    def process(self, elements):
        rows = []
        for element in elements:
            if isinstance(element, (pa.RecordBatch, pa.Table)):
                try:
                    yield conform(self._uri, element, self._schema, self._vector)
                except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError):
                    rows.extend(element.to_pylist())  # find the offending rows below
            elif isinstance(element, dict):
                rows.append(element)
            else:
                yield from self._reject(element, "expected a dict row or a RecordBatch, got "
                                                 f"{type(element).__name__}")
        if rows:
            yield from self._conform_rows(rows)

    def _one(self, rows):
        return conform(self._uri, pa.Table.from_pylist(rows, schema=self._schema),
                       self._schema, self._vector)

    def _conform_rows(self, rows):
        # Table.from_pylist drops keys the schema lacks: a misspelled column
        # would vanish silently, so they are looked for first, row by row.
        clean = []
        for row in rows:
            if self._names.issuperset(row):
                clean.append(row)
            else:
                extra = [k for k in row if k not in self._names]
                yield from self._reject(row, f"column(s) {extra} are not in the table schema "
                                             f"{self._schema.names}")
        if not clean:
            return
        try:
            yield self._one(clean)
            return
        except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, KeyError):
            pass
        good = []
        for row in clean:  # find the offenders one by one; keep the rest
            try:
                good.append(self._one([row]))
            except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, KeyError) as exc:
                yield from self._reject(row, self._diagnose(row, exc))
        if good:
            yield pa.concat_tables(good)

    def _diagnose(self, row, exc) -> str:
        """Names the first column of ``row`` that does not convert, with why."""
        for field in self._schema:
            try:
                pa.array([row.get(field.name)], type=field.type)
            except (pa.ArrowException, TypeError, ValueError) as err:
                return f"column {field.name!r}: {err}"
        return str(exc)

    def _reject(self, element, reason):
        if self._on_invalid == "fail":
            raise SchemaMismatchError(f"WriteToSupertable: invalid row {element!r}: {reason}")
        self._invalid.inc()
        yield pvalue.TaggedOutput(INVALID_TAG, (element, reason))


class _SampleVectors(beam.CombineFn):
    """Row count, Arrow bytes and a uniform random sample of the vectors.

    Priority sampling: every row draws a random key and the sample is the
    ``limit`` rows with the smallest keys, so batches and merges stay cheap
    and the result is uniform however the input was split.
    """

    def __init__(self, column: Optional[str], dim: int, limit: int) -> None:
        self._column, self._dim, self._limit = column, dim, limit

    def create_accumulator(self):
        return (0, 0, np.zeros(0, np.float64), None)

    def add_input(self, acc, table):
        rows, nbytes, keys, sample = acc
        rows, nbytes = rows + table.num_rows, nbytes + table.nbytes
        if self._column is None or table.num_rows == 0:
            return rows, nbytes, keys, sample
        u = np.random.random(table.num_rows)
        if sample is not None and len(keys) >= self._limit:
            take = u < np.partition(keys, self._limit - 1)[self._limit - 1]
        else:
            take = np.ones(table.num_rows, dtype=bool)
        if take.any():
            x = vectors_of(table.filter(pa.array(take)), self._column, self._dim)
            keys = np.concatenate([keys, u[take]])
            sample = x if sample is None else np.concatenate([sample, x])
            if len(keys) > 2 * self._limit:
                keys, sample = self._compact(keys, sample)
        return rows, nbytes, keys, sample

    def _compact(self, keys, sample):
        if len(keys) <= self._limit:
            return keys, sample
        keep = np.argpartition(keys, self._limit - 1)[:self._limit]
        return keys[keep], sample[keep]

    def merge_accumulators(self, accs):
        accs = list(accs)
        rows = sum(a[0] for a in accs)
        nbytes = sum(a[1] for a in accs)
        parts = [a for a in accs if a[3] is not None]
        if not parts:
            return rows, nbytes, np.zeros(0, np.float64), None
        keys, sample = self._compact(np.concatenate([a[2] for a in parts]),
                                     np.concatenate([a[3] for a in parts]))
        return rows, nbytes, keys, sample

    def extract_output(self, acc):
        rows, nbytes, keys, sample = acc
        if sample is not None:
            _, sample = self._compact(keys, sample)
        return rows, nbytes, sample


class _Plan(beam.DoFn):
    """Bounded input: the grid (the table's, or one trained on the sample) and n_shards."""

    def __init__(self, uri, storage_options, n_shards):
        self._uri, self._options, self._n_shards = uri, storage_options, n_shards

    def process(self, stats):
        rows, nbytes, sample = stats
        table = Supertable.open(self._uri, storage_options=self._options)
        target = table.properties.get("target_superfile_bytes", TARGET_SUPERFILE_BYTES)
        plan = {"n_shards": self._n_shards or max(1, math.ceil(nbytes / target)),
                "centroids": None, "stamp": None,
                # Read before anything of this run is built: the commit's
                # token cannot have landed at or below it.
                "base_version": table.version}
        if table.properties.get("vector"):
            plan["centroids"] = table.grid()
            plan["stamp"] = table.properties.get("grid")
            if plan["centroids"] is None and sample is not None and len(sample):
                plan["centroids"], plan["stamp"] = table.train_grid(sample, rows)
        yield plan


class _KeyByShard(beam.DoFn):
    """Assigns cells (vectorized per batch) and splits each batch by shard.

    Bounded input gets the grid as a side input (the plan). Unbounded input
    uses the table's grid when it has one; before the first vector commit the
    rows are spread over shards and the build step trains a grid.
    """

    def __init__(self, uri, storage_options, n_shards, replica_factor):
        self._uri, self._options = uri, storage_options
        self._n_shards, self._replica_factor = n_shards, replica_factor

    def setup(self):
        self._table = Supertable.open(self._uri, storage_options=self._options)
        self._vp = self._table.properties.get("vector")

    def start_bundle(self):
        # Unbounded input before the first vector commit: look for a grid once
        # per bundle, not once per batch.
        if self._vp is not None and self._table.grid() is None:
            self._table.refresh()

    def process(self, table, plan=None):
        if plan is None:
            n = self._n_shards
            centroids = self._table.grid() if self._vp is not None else None
        else:
            n, centroids = plan["n_shards"], plan["centroids"]
        if self._vp is None or centroids is None:
            yield int(np.random.randint(n)), (table, None, None)
            return
        cells, replicas = grid_mod.assign(vectors_of(table, self._vp["column"], self._vp["dim"]),
                                          centroids, self._vp["metric"], self._replica_factor)
        shard = cells % n
        for s in np.unique(shard):
            mask = shard == s
            yield int(s), (table.filter(pa.array(mask)), cells[mask],
                           None if replicas is None else replicas[mask])


class _BuildSuperfile(beam.DoFn):
    """Shards' rows -> uploaded superfiles -> their manifest entries.

    The shard groups of a bundle are built in parallel threads at the end of
    the bundle (numpy and Arrow release the GIL), so one worker uses every
    core. Each entry carries the grid it was built against under ``_grid``
    (dropped before the commit), so the commit can check they all agree.
    """

    def __init__(self, uri, storage_options):
        self._uri, self._options = uri, storage_options

    def setup(self):
        self._table = Supertable.open(self._uri, storage_options=self._options)
        self._built = Metrics.counter(NAMESPACE, "superfiles_built")
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)

    def teardown(self):
        self._pool.shutdown(wait=False)

    def start_bundle(self):
        self._pending = []

    def process(self, element, plan, win=beam.DoFn.WindowParam,
                ts=beam.DoFn.TimestampParam):
        shard, parts = element
        self._pending.append((self.submit(shard, list(parts), plan), win, ts))

    def finish_bundle(self):
        pending, self._pending = self._pending, []
        for future, win, ts in pending:
            yield WindowedValue(future.result(), ts, [win])

    def submit(self, shard, parts, plan):
        """Starts building one shard's superfile in the pool; a future of its entry."""
        return self._pool.submit(self._build, shard, parts, plan)

    def _build(self, shard, parts, plan):
        table = pa.concat_tables([p[0] for p in parts])
        cells = replicas = stamp = None
        vp = self._table.properties.get("vector")
        if parts[0][1] is not None:
            cells = np.concatenate([p[1] for p in parts])
            if parts[0][2] is not None:
                replicas = np.concatenate([p[2] for p in parts])
            stamp = plan["stamp"] if plan else Supertable.open(
                self._uri, storage_options=self._options).properties.get("grid")
        elif vp is not None:
            # Unbounded input before any grid: train one on this shard's rows.
            fresh = Supertable.open(self._uri, storage_options=self._options)
            centroids = fresh.grid()
            stamp = fresh.properties.get("grid")
            x = vectors_of(table, vp["column"], vp["dim"])
            if centroids is None:
                centroids, stamp = fresh.train_grid(x)
            cells, replicas = grid_mod.assign(x, centroids, vp["metric"],
                                              vp.get("replica_factor", 0.0))
        entry = build_and_upload(self._table.store, table, self._table.layout(), cells, replicas,
                                 stamp["sha256"] if stamp else None)
        if stamp:
            entry["_grid"] = stamp
        self._built.inc()
        _fail_first_attempt("build", str(shard))
        return entry


class _Commit(beam.DoFn):
    """Commits one firing's entries once; the token makes retries no-ops.

    The token is ``<prefix>/<window end µs>/<pane index>``. The prefix is the
    ``job_id`` when one is given (bounded input: a rerun of the job with the
    same rows is deduplicated), else the run id; unbounded input always has
    the run id in it (``<job_id>/<run>``), because a restarted streaming job
    numbers its panes from 0 again.
    """

    def __init__(self, uri, storage_options, job_id, scope: _RunScope, run_scoped: bool):
        self._uri, self._options, self._job_id = uri, storage_options, job_id
        self._scope, self._run_scoped = scope, run_scoped

    def setup(self):
        self._commits = Metrics.counter(NAMESPACE, "commits")
        self._rows = Metrics.counter(NAMESPACE, "rows_committed")
        self._deduplicated = Metrics.counter(NAMESPACE, "deduplicated_commits")

    def process(self, element, plan, win=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        yield from self.commit(element[1], win, pane, plan.get("base_version"))

    def token(self, win, pane) -> str:
        prefix = [self._job_id] if self._job_id else []
        if self._run_scoped or not self._job_id:
            prefix.append(self._scope.run)
        return "/".join(prefix + [str(win.max_timestamp().micros), str(pane.index)])

    def commit(self, entries, win, pane, since: Optional[int]):
        """Commits ``entries``; yields one CommitResult.

        Args:
            since: a version the table had before any of these entries was
                built; the token is looked for in every version after it.
        """
        entries = sorted(entries, key=lambda e: e["id"])
        if not entries:
            return
        token = self.token(win, pane)
        table = Supertable.open(self._uri, storage_options=self._options)
        for attempt in range(3):
            stamp, ready = self._agree_on_grid(table, entries)
            request = CommitRequest(operation="write", add_entries=tuple(ready),
                                    set_properties={"grid": stamp} if stamp else {},
                                    token=token, base_version=since,
                                    metadata={"job": self._job_id or self._scope.run})
            try:
                version = table.commit(request)
                break
            except CommitFailedError:
                raise  # out of retries: rebuilding would not help
            except CommitConflictError:
                if not stamp or attempt == 2:
                    raise
                table.refresh()  # another writer stamped its grid first: re-cell against it
        rows = sum(e["rows"] for e in entries)
        deduplicated = table.snapshot.deduplicated
        if deduplicated:
            self._deduplicated.inc()
        else:
            self._commits.inc()
            self._rows.inc(rows)
        _fail_first_attempt("commit", token)
        yield CommitResult(version, rows, len(entries), deduplicated)

    @staticmethod
    def _agree_on_grid(table: Supertable, entries: List[dict]):
        """The grid to stamp (None if the table has one) and entries that all use it."""
        stamps = {e["_grid"]["sha256"]: e["_grid"] for e in entries if "_grid" in e}
        held = table.properties.get("grid")
        if held is not None:
            target, stamp = held, None
        elif stamps:
            target = stamp = stamps[sorted(stamps)[0]]
        else:
            return None, [{k: v for k, v in e.items() if k != "_grid"} for e in entries]
        centroids = grid_mod.from_bytes(table.store.get(target["path"]))
        ready = []
        for e in entries:
            e = dict(e)
            e.pop("_grid", None)
            if e.get("grid") != target["sha256"]:
                e = _rebuild(table, e, centroids, target["sha256"])
            ready.append(e)
        return stamp, ready


class _TagFloor(beam.DoFn):
    """Unbounded input: ``(shard, part)`` -> ``(None, (shard, part, floor))``.

    ``floor`` is a version the table had before the part was tagged (at most
    ``FLOOR_REFRESH_S`` old), so the firing's commit can look for its token
    in every version since its oldest part, however many other writers
    committed meanwhile, and in no older ones.
    """

    def __init__(self, uri, storage_options):
        self._uri, self._options = uri, storage_options

    def setup(self):
        self._manifest = Manifest(ObjectStore(self._uri, self._options))
        self._floor, self._read_at = None, 0.0

    def start_bundle(self):
        now = time.monotonic()
        if self._floor is None or now - self._read_at > FLOOR_REFRESH_S:
            self._floor, self._read_at = self._manifest.latest_version(), now

    def process(self, element):
        shard, part = element
        yield None, (shard, part, self._floor)


class _BuildAndCommit(beam.DoFn):
    """Unbounded input: one firing's shard parts -> superfiles -> one commit."""

    def __init__(self, uri, storage_options, job_id, scope):
        self._builder = _BuildSuperfile(uri, storage_options)
        self._committer = _Commit(uri, storage_options, job_id, scope, run_scoped=True)

    def setup(self):
        self._builder.setup()
        self._committer.setup()

    def teardown(self):
        self._builder.teardown()

    def process(self, element, win=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        by_shard: Dict[int, list] = {}
        floors = []
        for shard, part, floor in element[1]:
            by_shard.setdefault(shard, []).append(part)
            floors.append(floor)
        futures = [self._builder.submit(shard, parts, None)
                   for shard, parts in sorted(by_shard.items())]
        entries = [f.result() for f in futures]
        yield from self._committer.commit(entries, win, pane, min(floors, default=None))


def _rebuild(table: Supertable, entry: dict, centroids: np.ndarray, grid_id: str) -> dict:
    """The same rows (same ``_id`` s) rebuilt into a superfile for another grid."""
    vp = table.properties["vector"]
    rows = table.read_superfile(entry, table.schema.names)
    ids = rows.column(ID).to_numpy()
    user = rows.drop_columns([ID])
    cells, replicas = grid_mod.assign(vectors_of(user, vp["column"], vp["dim"]), centroids,
                                      vp["metric"], vp.get("replica_factor", 0.0))
    return build_and_upload(table.store, user, table.layout(), cells, replicas, grid_id, ids=ids)


class WriteToSupertable(beam.PTransform):
    """Writes rows to a supertable with exactly-once OCC commits.

    Example::

        commits = rows | WriteToSupertable("s3://bucket/docs", schema=schema,
                                           vector_column="emb", fts_columns=["body"])
        # commits: CommitResult(version, rows, superfiles, deduplicated), one per commit
        result = rows | WriteToSupertable(...).with_invalid_output()
        # result.commits, and result.invalid: (row, reason) for rows that do not fit

    Args:
        uri: the table; created (with the other settings) when absent.
        schema: the user columns; required only to create the table, and must
            match an existing table's schema (checked while the pipeline is built).
        n_shards: superfiles per commit (default: input bytes / 64 MiB); rows
            go to shard ``cell % n_shards`` when the table has a vector column.
        on_invalid: ``"dead_letter"`` (the ``invalid`` output) or ``"fail"``.
        commit_every: unbounded input commits once per this many seconds of
            processing time (a repeated processing-time trigger).
        job_id: names the write in commit tokens. Bounded input: pass a
            stable id (say, the batch being loaded) to make a rerun of the
            same job exactly-once: a rerun with the same rows finds its commit
            and commits nothing (``CommitResult.deduplicated``); a rerun with
            other rows fails with ``TokenReuseError`` naming the token, as
            reusing one id for two loads is a bug that would otherwise lose
            data. By default every run gets a fresh id (each ``Pipeline.run``
            and each pipeline the transform is applied in). Unbounded input:
            tokens always include the run id, so a restarted streaming job
            commits its panes afresh (its pane indices start at 0 again); the
            ``job_id`` only labels the commits.

    Note:
        Bounded input lands as one commit. Each commit is visible to readers
        as soon as it lands; superfiles of attempts that fail are orphans for
        ``vacuum``. A commit whose token already landed with the same rows is
        logged at WARNING and counted in ``beam_supertable/deduplicated_commits``;
        ``beam_supertable/commits`` and ``rows_committed`` count new commits.
        A run's id is drawn when the pipeline is serialized to run, so one
        job graph serialized once and launched many times (a classic
        Dataflow template) shares it: give such a job a ``job_id`` per launch.
    """

    def __init__(self, uri: str, *, schema: Optional[pa.Schema] = None,
                 vector_column: Optional[str] = None, metric: Optional[Metric] = None,
                 fts_columns: Optional[Sequence[str]] = None, n_cells: Optional[int] = None,
                 n_shards: Optional[int] = None, storage_options: Optional[dict] = None,
                 on_invalid: OnInvalid = "dead_letter",
                 commit_every: float = DEFAULT_COMMIT_EVERY_S,
                 job_id: Optional[str] = None, replica_factor: Optional[float] = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS,
                 grid_sample_rows: int = DEFAULT_GRID_SAMPLE_ROWS,
                 label: Optional[str] = None) -> None:
        super().__init__(label)
        if on_invalid not in ON_INVALID:
            raise ValueError(
                f"WriteToSupertable: on_invalid must be one of {ON_INVALID}, got {on_invalid!r}")
        if metric is not None and metric not in METRICS:
            raise ValueError(f"WriteToSupertable: metric must be one of {METRICS}, got {metric!r}")
        if n_shards is not None and (not isinstance(n_shards, int) or n_shards < 1):
            raise ValueError(f"WriteToSupertable: n_shards must be a positive int, got {n_shards!r}")
        if commit_every <= 0:
            raise ValueError(f"WriteToSupertable: commit_every must be > 0, got {commit_every!r}")
        self._uri = uri
        self._options = storage_options
        self._n_shards = n_shards
        self._on_invalid = on_invalid
        self._commit_every = commit_every
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise ValueError(f"WriteToSupertable: job_id must be a non-empty str, got {job_id!r}")
        self._job_id = job_id
        self._scope = _RunScope()
        self._batch_rows = batch_rows
        self._sample_rows = grid_sample_rows
        self._with_invalid = False
        table = _open_or_create(uri, schema, vector_column, metric, fts_columns, n_cells,
                                storage_options, replica_factor)
        vp = table.properties.get("vector")
        if vector_column is not None and (vp is None or vp["column"] != vector_column):
            raise SchemaMismatchError(
                f"WriteToSupertable: the table at {uri!r} indexes "
                f"{vp['column'] if vp else 'no'} vector column, not {vector_column!r}")
        self._vector = vp
        self._replica_factor = vp.get("replica_factor", 0.0) if vp else 0.0

    def expand(self, rows):
        bounded = rows.is_bounded
        if not bounded:
            rows = rows | "Window" >> beam.WindowInto(
                window.GlobalWindows(),
                trigger=trigger.Repeatedly(trigger.AfterProcessingTime(self._commit_every)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
        batches = (rows
                   | "Batch" >> beam.BatchElements(min_batch_size=1,
                                                   max_batch_size=self._batch_rows)
                   | "Conform" >> beam.ParDo(_ToBatches(
                       self._uri, self._options, self._on_invalid)).with_outputs(
                           INVALID_TAG, main="batches"))
        keyer = _KeyByShard(self._uri, self._options, self._n_shards or DEFAULT_STREAMING_SHARDS,
                            self._replica_factor)
        if bounded:
            vp = self._vector
            stats = batches.batches | "Stats" >> beam.CombineGlobally(_SampleVectors(
                vp["column"] if vp else None, vp["dim"] if vp else 0, self._sample_rows))
            plan = beam.pvalue.AsSingleton(stats | "Plan" >> beam.ParDo(
                _Plan(self._uri, self._options, self._n_shards)))
            keyed = batches.batches | "KeyByShard" >> beam.ParDo(keyer, plan)
            built = (keyed | "GroupByShard" >> beam.GroupByKey()
                     | "Build" >> beam.ParDo(_BuildSuperfile(self._uri, self._options), plan))
            commits = (built
                       | "OneKey" >> beam.Map(lambda e: (None, e))
                       | "Gather" >> beam.GroupByKey()
                       | "Commit" >> beam.ParDo(_Commit(self._uri, self._options, self._job_id,
                                                        self._scope, run_scoped=False), plan
                                              ).with_output_types(CommitResult))
        else:
            # One GroupByKey per firing: a second one downstream of a
            # processing-time trigger (its continuation trigger) never lets
            # the DirectRunner of apache-beam 2.62 finish. A firing's shards
            # are built in parallel threads by the one worker that commits them.
            commits = (batches.batches
                       | "KeyByShard" >> beam.ParDo(keyer)
                       | "OneKey" >> beam.ParDo(_TagFloor(self._uri, self._options))
                       | "GatherFiring" >> beam.GroupByKey()
                       | "BuildAndCommit" >> beam.ParDo(_BuildAndCommit(
                           self._uri, self._options, self._job_id, self._scope)
                       ).with_output_types(CommitResult))
        if not self._with_invalid:
            return commits
        return WriteResult(commits, batches[INVALID_TAG])

    def to_runner_api(self, context, **kwargs):
        # Serializing the pipeline to run it: a fresh run id, written into
        # the DoFns pickled right after this (they share the scope object).
        self._scope.renew()
        return super().to_runner_api(context, **kwargs)

    def with_invalid_output(self) -> "WriteToSupertable":
        """Makes the transform return ``WriteResult(commits, invalid)``.

        ``invalid`` holds ``(row, reason)`` for every row that does not fit the
        schema (they are dropped and counted either way).
        """
        self._with_invalid = True
        return self

    def display_data(self):
        return {
            "uri": DisplayDataItem(self._uri, label="Table"),
            "n_shards": DisplayDataItem(self._n_shards or 0, label="Shards (0 = by size)"),
            "on_invalid": DisplayDataItem(self._on_invalid, label="Invalid rows"),
            "job_id": DisplayDataItem(self._job_id or "(one per run)", label="Job id"),
            "vector_column": DisplayDataItem(
                self._vector["column"] if self._vector else "", label="Vector column"),
            "metric": DisplayDataItem(self._vector["metric"] if self._vector else "",
                                      label="Metric"),
            "commit_every": DisplayDataItem(self._commit_every,
                                            label="Commit every (s, unbounded input)"),
            "batch_rows": DisplayDataItem(self._batch_rows, label="Rows per batch"),
            "grid_sample_rows": DisplayDataItem(self._sample_rows, label="Grid sample rows"),
        }


class WriteResult(NamedTuple):
    """What ``WriteToSupertable(...).with_invalid_output()`` returns."""

    commits: beam.PCollection
    invalid: beam.PCollection


class _ListSuperfiles(beam.DoFn):
    def __init__(self, uri, storage_options, version, filter):  # noqa: A002
        self._uri, self._options, self._version, self._filter = uri, storage_options, version, filter

    def process(self, _):
        table = Supertable.open(self._uri, version=self._version, storage_options=self._options)
        yield from pruned(table.superfiles(), self._filter, table.schema)


class _ReadSuperfile(beam.DoFn):
    def __init__(self, uri, storage_options, version, columns, filter, as_batches):  # noqa: A002
        self._uri, self._options, self._version = uri, storage_options, version
        self._columns, self._filter, self._as_batches = columns, filter, as_batches

    def setup(self):
        self._table = Supertable.open(self._uri, version=self._version,
                                      storage_options=self._options)
        self._read = Metrics.counter(NAMESPACE, "rows_read")

    def process(self, entry):
        names = list(self._columns) if self._columns else self._table.schema.names
        table = self._table.read_superfile(entry, names, self._filter)
        self._read.inc(table.num_rows)
        if self._as_batches:
            yield from table.to_batches()
        else:
            yield from table.to_pylist()


class ReadFromSupertable(beam.PTransform):
    """Reads one version of a supertable, in parallel by superfile.

    Args:
        version: the version to read (default: the latest when the pipeline
            is built, so every worker reads the same snapshot).
        columns: columns to return (default all, ``_id`` included).
        filter: a pyarrow expression; superfiles whose column statistics rule
            it out are skipped without being opened.
        as_batches: yield ``pyarrow.RecordBatch`` es instead of dict rows.
    """

    def __init__(self, uri: str, *, version: Optional[int] = None,
                 columns: Optional[Sequence[str]] = None, filter: Optional[pc.Expression] = None,  # noqa: A002
                 as_batches: bool = False, storage_options: Optional[dict] = None,
                 label: Optional[str] = None) -> None:
        super().__init__(label)
        table = Supertable.open(uri, version=version, storage_options=storage_options)
        unknown = [c for c in (columns or ()) if c not in table.schema.names]
        if unknown:
            raise SchemaMismatchError(
                f"ReadFromSupertable: unknown column(s) {unknown}; the table has {table.schema.names}")
        self._uri, self._options = uri, storage_options
        self._version = table.version
        self._columns, self._filter, self._as_batches = columns, filter, as_batches

    def expand(self, pbegin):
        return (pbegin
                | "Start" >> beam.Create([None])
                | "ListSuperfiles" >> beam.ParDo(_ListSuperfiles(
                    self._uri, self._options, self._version, self._filter))
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadSuperfile(
                    self._uri, self._options, self._version, self._columns, self._filter,
                    self._as_batches)).with_output_types(
                        pa.RecordBatch if self._as_batches else Dict[str, Any]))

    def display_data(self):
        return {"uri": DisplayDataItem(self._uri, label="Table"),
                "version": DisplayDataItem(self._version, label="Version"),
                "columns": DisplayDataItem(", ".join(self._columns or ()) or "(all)",
                                           label="Columns"),
                "filter": DisplayDataItem(str(self._filter) if self._filter is not None else "",
                                          label="Filter"),
                "as_batches": DisplayDataItem(self._as_batches, label="Arrow batches")}
