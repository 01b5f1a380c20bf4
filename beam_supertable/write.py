"""``WriteToSupertable``: a thin Beam adapter over the table's write path.

A two-stage write in the manner of Beam's ``WriteToFiles``: workers conform
rows, assign cells on the table's grid and build and upload superfiles under
fresh names in parallel (``writer.build_and_upload``, as ``Supertable.append``
does); then one step commits them through ``Supertable.commit_superfiles``,
the commit every write of the table goes through (one grid agreement, one
conflict path, one request builder). Its idempotency token comes from the job
and the window/firing, so a retried bundle or a rerun of the same job never
commits twice. Superfiles of failed attempts are orphans that
``Supertable.vacuum`` reclaims.

The table. Building the pipeline only reads: settings given must match an
existing table (checked then), and a missing table needs a ``schema``. A
missing table is created inside the pipeline, by whichever step needs it
first, through ``Supertable.create(mode="exist_ok")``: concurrent creators
(workers, or other pipelines) agree through the atomic create of version 0,
and one that finds a table with other settings fails naming what differs.

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

import functools
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Literal, NamedTuple, Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.utils.windowed_value import WindowedValue

from beam_supertable.errors import NotATableError, SchemaMismatchError
from beam_supertable.manifest import Manifest
from beam_supertable.mutation import Mutation
from beam_supertable.read import NAMESPACE
from beam_supertable.schema import conform
from beam_supertable.superfile import vectors_of
from beam_supertable.table import Supertable
from beam_supertable.writer import assign_cells, build_and_upload, shard_count

__all__ = ["CommitResult", "WriteResult", "WriteToSupertable"]

Metric = Literal["l2", "cosine", "dot"]
METRICS = ("l2", "cosine", "dot")
OnInvalid = Literal["dead_letter", "fail"]
ON_INVALID = ("dead_letter", "fail")

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


class WriteResult(NamedTuple):
    """What ``WriteToSupertable(...).with_invalid_output()`` returns."""

    commits: beam.PCollection
    invalid: beam.PCollection


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


class _TableRef:
    """How the pipeline's steps reach the table: opened, or created if missing.

    Args:
        create: ``Supertable.create`` settings when the table was missing
            while the pipeline was built; every step then opens it with
            ``create(mode="exist_ok")``, which writes only when it is still
            missing (the atomic create settles concurrent creators) and
            checks an existing one against these settings.
        keyed: the steps serve ``UpsertToSupertable``, which writes keyed
            tables (``WriteToSupertable`` refuses them).
    """

    def __init__(self, uri: str, storage_options: Optional[dict],
                 create: Optional[Dict[str, Any]] = None, keyed: bool = False) -> None:
        self.uri, self.storage_options, self.create = uri, storage_options, create
        self.keyed = keyed

    def open(self) -> Supertable:
        """The latest version (created first when missing and ``create`` is set)."""
        if self.create is None:
            table = Supertable.open(self.uri, storage_options=self.storage_options)
        else:
            table = Supertable.create(self.uri, storage_options=self.storage_options,
                                      mode="exist_ok", **self.create)
        if not self.keyed:
            _refuse_keyed(table)
        return table

    def at(self, version: int) -> Supertable:
        """The table as of ``version`` (a run's pinned version), one handle per worker."""
        return _pinned(self.uri, json.dumps(self.storage_options, sort_keys=True), version)


@functools.lru_cache(maxsize=8)
def _pinned(uri: str, options: str, version: int) -> Supertable:
    # A version never changes: every stage of a worker process shares one handle.
    return Supertable.open(uri, version=version, storage_options=json.loads(options))


def _refuse_keyed(table: Supertable) -> None:
    """The sink appends without key checks: on a keyed table that could make
    two live rows of one key, so it is refused (``UpsertToSupertable`` writes
    keyed tables)."""
    if table.primary_key:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {table.uri!r} is keyed (primary key "
            f"{table.primary_key}); the sink appends without key checks, which could leave "
            f"two live rows of one key. Write keyed tables with UpsertToSupertable, or "
            f"Supertable.upsert/append")


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


def _check_existing(table: Supertable, schema: Optional[pa.Schema],
                    given: Dict[str, Any]) -> None:
    """Settings given to ``WriteToSupertable`` must match the existing ``table``'s."""
    uri = table.uri
    _refuse_keyed(table)
    if schema is not None and not schema.equals(table.user_schema):
        raise SchemaMismatchError(
            f"WriteToSupertable: schema does not match the table at {uri!r}.\n"
            f"received:\n{schema}\nthe table has:\n{table.user_schema}")
    vp = table.properties.get("vector") or {}
    fp = table.properties.get("fts") or {}
    held = {"vector_column": vp.get("column"), "metric": vp.get("metric"),
            "fts_columns": tuple(fp.get("columns", ())), "n_cells": vp.get("n_cells"),
            "replica_factor": vp.get("replica_factor", 0.0)}
    if given["vector_column"] is not None and given["vector_column"] != held["vector_column"]:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {uri!r} indexes "
            f"{held['vector_column'] or 'no'} vector column, not {given['vector_column']!r}")
    differ = [f"{name}={value!r} (the table has {held[name]!r})"
              for name, value in given.items() if value is not None and value != held[name]]
    if differ:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {uri!r} was created with other settings: "
            f"{', '.join(differ)}; these settings apply only when the table is created")


class _ToBatches(beam.DoFn):
    """A list of rows (dicts) or RecordBatches -> conformed Arrow tables.

    Rows that do not fit go to ``invalid`` with the reason (or fail the job
    with ``on_invalid="fail"``); the others go on.
    """

    def __init__(self, table: _TableRef, on_invalid: str) -> None:
        self._table, self._uri, self._on_invalid = table, table.uri, on_invalid

    def setup(self):
        table = self._table.open()
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
    and the result is uniform however the input was split. The vector
    column is the table's (read once per worker; a table's layout never
    changes).
    """

    def __init__(self, table: _TableRef, limit: int) -> None:
        self._table, self._limit = table, limit

    def setup(self):
        vector = self._table.open().layout().vector
        self._column = vector.column if vector else None
        self._dim = vector.dim if vector else 0

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
    """Bounded input: the grid (the table's, or one trained on the sample) and n_shards.

    The table is the latest version, or the run's pinned one when a ``pin``
    (``{"version": ...}``, ``UpsertToSupertable``) comes as a side input.
    """

    def __init__(self, table: _TableRef, n_shards: Optional[int]) -> None:
        self._table, self._n_shards = table, n_shards

    def process(self, stats, pin=None):
        rows, nbytes, sample = stats
        table = self._table.open() if pin is None else self._table.at(pin["version"])
        plan = {"n_shards": shard_count(nbytes, table.layout(), self._n_shards),
                "centroids": None, "stamp": None,
                # Read before anything of this run is built: the commit's
                # token cannot have landed at or below it.
                "base_version": table.version}
        if table.layout().vector is not None:
            plan["centroids"] = table.grid()
            plan["stamp"] = table.properties.get("grid")
            if plan["centroids"] is None and sample is not None and len(sample):
                plan["centroids"], plan["stamp"] = table.train_grid(sample, rows)
        yield plan


class _KeyByShard(beam.DoFn):
    """Assigns cells (vectorized per batch) and splits each batch by shard.

    Emits ``(shard, (rows, cells, replicas, grid))``, ``grid`` being the
    stamp of the grid the cells are on. Bounded input gets the grid as a
    side input (the plan). Unbounded input uses the table's grid when it has
    one; before the first vector commit the rows are spread over shards
    without cells and the build step cells them.
    """

    def __init__(self, table: _TableRef, n_shards: int) -> None:
        self._table, self._n_shards = table, n_shards

    def setup(self):
        self._handle = self._table.open()
        self._layout = self._handle.layout()

    def start_bundle(self):
        # Unbounded input before the first vector commit: look for a grid once
        # per bundle, not once per batch.
        if self._layout.vector is not None and self._handle.grid() is None:
            self._handle.refresh()

    def process(self, rows, plan=None):
        if plan is None:
            n, grid = self._n_shards, self._handle.properties.get("grid")
            centroids = self._handle.grid() if self._layout.vector is not None else None
        else:
            n, centroids, grid = plan["n_shards"], plan["centroids"], plan["stamp"]
        if self._layout.vector is None or centroids is None:
            yield int(np.random.randint(n)), (rows, None, None, None)
            return
        cells, replicas = assign_cells(rows, self._layout, centroids)
        shard = cells % n
        for s in np.unique(shard):
            mask = shard == s
            yield int(s), (rows.filter(pa.array(mask)), cells[mask],
                           None if replicas is None else replicas[mask], grid)


class _BuildSuperfile(beam.DoFn):
    """Shards' rows -> uploaded superfiles -> ``(entry, grid)`` pairs.

    The shard groups of a bundle are built in parallel threads at the end of
    the bundle (numpy and Arrow release the GIL), so one worker uses every
    core. ``grid`` is the stamp of the grid a superfile was built against,
    for the commit's grid agreement.
    """

    def __init__(self, table: _TableRef) -> None:
        self._table = table

    def setup(self):
        self._handle = self._table.open()
        self._built = Metrics.counter(NAMESPACE, "superfiles_built")
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)

    def teardown(self):
        self._pool.shutdown(wait=False)

    def start_bundle(self):
        self._pending = []

    def process(self, element, win=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam):
        shard, parts = element
        self._pending.append((self.submit(shard, list(parts)), win, ts))

    def finish_bundle(self):
        pending, self._pending = self._pending, []
        for future, win, ts in pending:
            yield WindowedValue(future.result(), ts, [win])

    def submit(self, shard, parts):
        """Starts building one shard's superfile in the pool; a future of ``(entry, grid)``."""
        return self._pool.submit(self._build, shard, parts)

    def _build(self, shard, parts):
        rows = pa.concat_tables([p[0] for p in parts])
        layout = self._handle.layout()
        grids = {p[3]["sha256"] if p[3] else None for p in parts}
        if layout.vector is None:
            grid = None
            entry = build_and_upload(self._handle.store, rows, layout, None, None, None)
        elif None not in grids and len(grids) == 1:
            cells = np.concatenate([p[1] for p in parts])
            replicas = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
            grid = parts[0][3]
            entry = build_and_upload(self._handle.store, rows, layout, cells, replicas,
                                     grid["sha256"])
        else:
            # Unbounded rows cut before (or as) the table got its first grid:
            # the table's own write path cells them all on one grid, training
            # one on these rows if the table still has none.
            handle = self._table.open()
            entries, stamp = handle.write_superfiles(rows, n_shards=1, conformed=True)
            entry, grid = entries[0], stamp.get("grid") or handle.properties.get("grid")
        self._built.inc()
        _fail_first_attempt("build", str(shard))
        return entry, grid


class _Commit(beam.DoFn):
    """Commits one firing's superfiles once; the token makes retries no-ops.

    The token is ``<prefix>/<window end µs>/<pane index>``. The prefix is the
    ``job_id`` when one is given (bounded input: a rerun of the job with the
    same rows is deduplicated), else the run id; unbounded input always has
    the run id in it (``<job_id>/<run>``), because a restarted streaming job
    numbers its panes from 0 again.
    """

    def __init__(self, table: _TableRef, job_id: Optional[str], scope: _RunScope,
                 run_scoped: bool) -> None:
        self._table, self._job_id = table, job_id
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

    def commit(self, built, win, pane, since: Optional[int]):
        """Commits the ``(entry, grid)`` pairs ``built``; yields one CommitResult.

        Args:
            since: a version the table had before any of these superfiles
                was built; the token is looked for in every version after it.
        """
        built = sorted(built, key=lambda b: b[0]["id"])
        if not built:
            return
        entries = [entry for entry, _ in built]
        token = self.token(win, pane)
        table = self._table.open()
        mutation = Mutation(table, "write", token=token, base_version=since,
                            metadata={"job": self._job_id or self._scope.run})
        version = table.commit_superfiles(entries, mutation,
                                          grids=[grid for _, grid in built if grid])
        rows = sum(e["rows"] for e in entries)
        deduplicated = table.snapshot.deduplicated
        if deduplicated:
            self._deduplicated.inc()
        else:
            self._commits.inc()
            self._rows.inc(rows)
        _fail_first_attempt("commit", token)
        yield CommitResult(version, rows, len(entries), deduplicated)


class _TagFloor(beam.DoFn):
    """Unbounded input: ``(shard, part)`` -> ``(None, (shard, part, floor))``.

    ``floor`` is a version the table had before the part was tagged (at most
    ``FLOOR_REFRESH_S`` old), so the firing's commit can look for its token
    in every version since its oldest part, however many other writers
    committed meanwhile, and in no older ones.
    """

    def __init__(self, table: _TableRef) -> None:
        self._table = table

    def setup(self):
        self._manifest = Manifest(self._table.open().store)
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

    def __init__(self, table: _TableRef, job_id: Optional[str], scope: _RunScope) -> None:
        self._builder = _BuildSuperfile(table)
        self._committer = _Commit(table, job_id, scope, run_scoped=True)

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
        futures = [self._builder.submit(shard, parts) for shard, parts in sorted(by_shard.items())]
        built = [f.result() for f in futures]
        yield from self._committer.commit(built, win, pane, min(floors, default=None))


def build_superfiles(batches: beam.PCollection, table: _TableRef, n_shards: Optional[int],
                     sample_rows: int, pin: Optional[pvalue.AsSingleton] = None):
    """Bounded input: conformed Arrow tables -> uploaded superfiles, in parallel.

    The stages ``WriteToSupertable`` and ``UpsertToSupertable`` share: row
    count, bytes and a vector sample; the plan (grid and shard count);
    rows keyed by shard (``cell % n_shards``); one superfile per shard.

    Args:
        batches: Arrow tables of the table's user columns, conformed.
        n_shards: superfiles to build (default: by bytes).
        sample_rows: vectors sampled to train a grid when the table has none.
        pin: the run's pinned version (``{"version": ...}``), for a plan on
            that version rather than the latest.

    Returns:
        ``(plan, built)``: the plan as a singleton side input, and the
        ``(entry, grid)`` pairs of the uploaded, uncommitted superfiles.
    """
    # Without defaults: an empty input has no stats, so no plan, and nothing
    # is built or committed. The default would come through a side input, a
    # stage of its own on a portable runner (Flink), between sample and plan.
    sample = beam.CombineGlobally(_SampleVectors(table, sample_rows)).without_defaults()
    stats = batches | "Stats" >> sample
    extra = () if pin is None else (pin,)
    plan = beam.pvalue.AsSingleton(stats | "Plan" >> beam.ParDo(_Plan(table, n_shards), *extra))
    built = (batches
             | "KeyByShard" >> beam.ParDo(_KeyByShard(table, DEFAULT_STREAMING_SHARDS), plan)
             | "GroupByShard" >> beam.GroupByKey()
             | "Build" >> beam.ParDo(_BuildSuperfile(table)))
    return plan, built


class WriteToSupertable(beam.PTransform):
    """Writes rows to a supertable with exactly-once OCC commits.

    Example::

        commits = rows | WriteToSupertable("s3://bucket/docs", schema=schema,
                                           vector_column="emb", fts_columns=["body"])
        # commits: CommitResult(version, rows, superfiles, deduplicated), one per commit
        result = rows | WriteToSupertable(...).with_invalid_output()
        # result.commits, and result.invalid: (row, reason) for rows that do not fit

    Args:
        uri: the table; created (with the other settings) inside the
            pipeline when absent. Building the pipeline never writes.
        schema: the user columns; required only to create the table, and must
            match an existing table's schema (checked while the pipeline is built).
        vector_column, metric, fts_columns, n_cells, replica_factor: the
            ``Supertable.create`` settings of a table created here; for an
            existing table, the ones given must match it.
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
        batch_rows: rows per Arrow batch the workers conform and cell.
        grid_sample_rows: bounded input: vectors sampled to train the first grid.

    Raises:
        ValueError, TypeError: a bad argument, or no table at ``uri`` and no
            ``schema`` (while the pipeline is built).
        SchemaMismatchError: settings that do not match the table at ``uri``.

    Note:
        Bounded input lands as one commit, whatever its windows or trigger
        (it is re-windowed into the global window first). Each commit is visible to readers
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
        _check_arguments(uri=uri, schema=schema, vector_column=vector_column, metric=metric,
                         fts_columns=fts_columns, n_cells=n_cells, n_shards=n_shards,
                         storage_options=storage_options, on_invalid=on_invalid,
                         commit_every=commit_every, job_id=job_id,
                         replica_factor=replica_factor, batch_rows=batch_rows,
                         grid_sample_rows=grid_sample_rows)
        self._uri = uri
        self._options = storage_options
        self._n_shards = n_shards
        self._on_invalid = on_invalid
        self._commit_every = commit_every
        self._job_id = job_id
        self._scope = _RunScope()
        self._batch_rows = batch_rows
        self._sample_rows = grid_sample_rows
        self._with_invalid = False
        fts = None if fts_columns is None else tuple(fts_columns)
        try:
            table = Supertable.open(uri, storage_options=storage_options)   # reads only
        except NotATableError:
            table = None
        if table is not None:
            _check_existing(table, schema, {
                "vector_column": vector_column, "metric": metric, "fts_columns": fts,
                "n_cells": n_cells, "replica_factor": replica_factor})
            self._table = _TableRef(uri, storage_options)
            self._vector = table.properties.get("vector")
            return
        if schema is None:
            raise ValueError(
                f"WriteToSupertable: no table at {uri!r} and no schema to create one; "
                "pass schema=pyarrow.schema([...])")
        create = {"schema": schema, "vector_column": vector_column, "metric": metric or "l2",
                  "fts_columns": fts or (), "n_cells": n_cells,
                  "replica_factor": 0.0 if replica_factor is None else replica_factor}
        _, properties = Supertable.describe_create(uri, **create)   # validates, writes nothing
        self._table = _TableRef(uri, storage_options, create)
        self._vector = properties.get("vector")

    def expand(self, rows):
        bounded = rows.is_bounded
        if bounded and not rows.windowing.is_default():
            # Bounded input lands as one commit: upstream windows or triggers
            # would split the sample, the plan (a grid trained per window)
            # and the commit per window or pane.
            rows = rows | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        if not bounded:
            rows = rows | "Window" >> beam.WindowInto(
                window.GlobalWindows(),
                trigger=trigger.Repeatedly(trigger.AfterProcessingTime(self._commit_every)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
        batches = (rows
                   | "Batch" >> beam.BatchElements(min_batch_size=1,
                                                   max_batch_size=self._batch_rows)
                   | "Conform" >> beam.ParDo(_ToBatches(self._table, self._on_invalid))
                   .with_outputs(INVALID_TAG, main="batches"))
        if bounded:
            plan, built = build_superfiles(batches.batches, self._table, self._n_shards,
                                           self._sample_rows)
            commits = (built
                       | "OneKey" >> beam.Map(lambda e: (None, e))
                       | "Gather" >> beam.GroupByKey()
                       | "Commit" >> beam.ParDo(_Commit(self._table, self._job_id, self._scope,
                                                        run_scoped=False), plan
                                              ).with_output_types(CommitResult))
        else:
            # One GroupByKey per firing: a second one downstream of a
            # processing-time trigger (its continuation trigger) never lets
            # the DirectRunner of apache-beam 2.62 finish. A firing's shards
            # are built in parallel threads by the one worker that commits them.
            commits = (batches.batches
                       | "KeyByShard" >> beam.ParDo(_KeyByShard(
                           self._table, self._n_shards or DEFAULT_STREAMING_SHARDS))
                       | "OneKey" >> beam.ParDo(_TagFloor(self._table))
                       | "GatherFiring" >> beam.GroupByKey()
                       | "BuildAndCommit" >> beam.ParDo(_BuildAndCommit(
                           self._table, self._job_id, self._scope)
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
            "creates": DisplayDataItem(self._table.create is not None,
                                       label="Creates the table if missing"),
        }


def _positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _check_arguments(*, uri, schema, vector_column, metric, fts_columns, n_cells, n_shards,
                     storage_options, on_invalid, commit_every, job_id, replica_factor,
                     batch_rows, grid_sample_rows) -> None:
    """``WriteToSupertable``'s arguments, each checked on its own (nothing is read)."""
    def bad(name: str, want: str, got) -> ValueError:
        return ValueError(f"WriteToSupertable: {name} must be {want}, got {got!r}")

    if not isinstance(uri, str) or not uri:
        raise TypeError(f"WriteToSupertable: uri must be a non-empty str, got {uri!r}")
    if schema is not None and not isinstance(schema, pa.Schema):
        raise TypeError(f"WriteToSupertable: schema must be a pyarrow.Schema or None, "
                        f"got {type(schema).__name__}")
    if vector_column is not None and not isinstance(vector_column, str):
        raise TypeError(f"WriteToSupertable: vector_column must be a str or None, "
                        f"got {vector_column!r}")
    if fts_columns is not None and (isinstance(fts_columns, str) or
                                    not all(isinstance(c, str) for c in fts_columns)):
        raise TypeError(f"WriteToSupertable: fts_columns must be a list of column names, "
                        f"got {fts_columns!r}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"WriteToSupertable: storage_options must be a dict or None, "
                        f"got {type(storage_options).__name__}")
    if on_invalid not in ON_INVALID:
        raise bad("on_invalid", f"one of {ON_INVALID}", on_invalid)
    if metric is not None and metric not in METRICS:
        raise bad("metric", f"one of {METRICS}", metric)
    for name, value in (("n_shards", n_shards), ("n_cells", n_cells)):
        if value is not None and not _positive_int(value):
            raise bad(name, "a positive int", value)
    for name, value in (("batch_rows", batch_rows), ("grid_sample_rows", grid_sample_rows)):
        if not _positive_int(value):
            raise bad(name, "a positive int", value)
    if isinstance(commit_every, bool) or not isinstance(commit_every, (int, float)) \
            or commit_every <= 0:
        raise bad("commit_every", "> 0 seconds", commit_every)
    if replica_factor is not None and (isinstance(replica_factor, bool) or not isinstance(
            replica_factor, (int, float)) or not 0 <= replica_factor <= 1):
        raise bad("replica_factor", "a share between 0 and 1", replica_factor)
    if job_id is not None and (not isinstance(job_id, str) or not job_id):
        raise bad("job_id", "a non-empty str", job_id)
