"""The stages of ``WriteToSupertable`` (and of ``UpsertToSupertable``'s write):
conform rows, plan, build superfiles, commit once per firing."""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, NamedTuple, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from beam_supertable.errors import NotATableError, SchemaMismatchError
from beam_supertable.format.manifest import Manifest
from beam_supertable.format.row_reasons import find_problems, got, id_column, row_label
from beam_supertable.format.schema import conform
from beam_supertable.transforms.schema_merge import concat_conformed, widen_for
from beam_supertable.vector.metric import vectors_of
from beam_supertable.format.writer import assign_cells, build_and_upload, shard_count
from beam_supertable.table.mutation import Mutation
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms.read import NAMESPACE
from beam_supertable.transforms.write_checks import _refuse_keyed
from beam_upsert.model import Invalid

INVALID_TAG = "invalid"
DEFAULT_BATCH_ROWS = 4096
DEFAULT_GRID_SAMPLE_ROWS = 50_000
DEFAULT_COMMIT_EVERY_S = 60
DEFAULT_STREAMING_SHARDS = 2     # superfiles per firing when the input size is unknown


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
        on_stage: ``WriteToSupertable``'s ``on_stage`` hook.
    """

    def __init__(self, uri: str, storage_options: Optional[dict],
                 create: Optional[Dict[str, Any]] = None, keyed: bool = False,
                 on_stage: Optional[Callable[[str, str], None]] = None) -> None:
        self.uri, self.storage_options, self.create = uri, storage_options, create
        self.keyed = keyed
        self.on_stage = on_stage

    def stage_done(self, stage: str, key: str) -> None:
        """Calls the ``on_stage`` hook, if any, after a stage's side effects."""
        if self.on_stage is not None:
            self.on_stage(stage, key)

    def open(self) -> Supertable:
        """The latest version (created first when missing and ``create`` is set)."""
        if self.create is None:
            table = Supertable.open(self.uri, storage_options=self.storage_options)
        elif getattr(self, "merge", False) and self._exists():
            # schema_mode="merge": columns the rows brought may have been added
            # since it was created here; its schema is no longer the one given.
            table = Supertable.open(self.uri, storage_options=self.storage_options)
        else:
            table = Supertable.create(self.uri, storage_options=self.storage_options,
                                      mode="exist_ok", **self.create)
        if not self.keyed:
            _refuse_keyed(table)
        return table

    def _exists(self) -> bool:
        try:
            Supertable.open(self.uri, storage_options=self.storage_options)
            return True
        except NotATableError:
            return False

    def at(self, version: int) -> Supertable:
        """The table as of ``version`` (a run's pinned version), one handle per worker."""
        return _pinned(self.uri, json.dumps(self.storage_options, sort_keys=True), version)


@functools.lru_cache(maxsize=8)
def _pinned(uri: str, options: str, version: int) -> Supertable:
    # A version never changes: every stage of a worker process shares one handle.
    return Supertable.open(uri, version=version, storage_options=json.loads(options))


class _ToBatches(beam.DoFn):
    """A list of rows (dicts) or RecordBatches -> conformed Arrow tables.

    Rows that do not fit go to ``invalid`` as ``Invalid(row, reason)`` (or
    fail the job with ``on_invalid="fail"``); the others go on. A reason
    names the row (by its ``id`` column when the table has one, else by its
    position in the batch or in its RecordBatch), the column, what the
    table expects and what the row holds.
    """

    def __init__(self, table: _TableRef, on_invalid: str, schema_mode: str = "strict") -> None:
        self._table, self._uri, self._on_invalid = table, table.uri, on_invalid
        self._merge = schema_mode == "merge"

    def setup(self):
        self._follow(self._table.open())
        self._invalid = Metrics.counter(NAMESPACE, "invalid_rows")

    def _follow(self, table: Supertable) -> None:
        self._schema = table.user_schema
        self._names = frozenset(self._schema.names)
        self._id = id_column(self._schema)
        vp = table.properties.get("vector")
        self._vector = vp["column"] if vp else None

    def process(self, elements):
        if self._merge:
            # schema_mode="merge": columns the table lacks are added first.
            elements = list(elements)
            widened = widen_for(self._table.open, elements, self._names)
            if widened is not None:
                self._follow(widened)
        rows, where = [], []   # the rows to conform, and each one's position
        for i, element in enumerate(elements):
            if isinstance(element, (pa.RecordBatch, pa.Table)):
                try:
                    yield conform(self._uri, element, self._schema, self._vector)
                except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError):
                    # Find the offending rows below.
                    kind = type(element).__name__
                    batch = element.to_pylist()
                    rows.extend(batch)
                    where.extend(f"{j} of a {kind}" for j in range(len(batch)))
            elif isinstance(element, dict):
                rows.append(element)
                where.append(i)
            else:
                yield from self._reject(element, f"row {i}: expected a dict row or a "
                                                 f"RecordBatch, got {got(element)}")
        if rows:
            yield from self._conform_rows(rows, where)

    def _one(self, rows):
        return conform(self._uri, pa.Table.from_pylist(rows, schema=self._schema),
                       self._schema, self._vector)

    def _label(self, row, position) -> str:
        return row_label(row, position, self._id)

    def _conform_rows(self, rows, where):
        # Table.from_pylist drops keys the schema lacks: a misspelled column
        # would vanish silently, so they are looked for first, row by row.
        clean = []
        for row, position in zip(rows, where):
            if self._names.issuperset(row):
                clean.append((row, position))
            else:
                extra = [k for k in row if k not in self._names]
                yield from self._reject(row, f"{self._label(row, position)}: column(s) {extra} "
                                             f"are not in the table schema {self._schema.names}")
        if not clean:
            return
        try:
            yield self._one([row for row, _ in clean])
            return
        except _CONFORM_ERRORS:
            pass
        # The slow path, only for a batch that does not fit: the offenders,
        # found column by column; the rest conform together.
        problems = find_problems([row for row, _ in clean], self._schema, self._vector)
        rest = []
        for n, (row, position) in enumerate(clean):
            if n in problems:
                yield from self._reject(row, f"{self._label(row, position)}: {problems[n]}")
            else:
                rest.append((row, position))
        if not rest:
            return
        try:
            yield self._one([row for row, _ in rest])
            return
        except _CONFORM_ERRORS:
            pass
        good = []
        for row, position in rest:   # a cause the columns did not show: row by row
            try:
                good.append(self._one([row]))
            except _CONFORM_ERRORS as exc:
                yield from self._reject(row, f"{self._label(row, position)}: "
                                             f"{_without_uri(exc, self._uri)}")
        if good:
            yield pa.concat_tables(good)

    def _reject(self, element, reason):
        if self._on_invalid == "fail":
            raise SchemaMismatchError(f"WriteToSupertable: invalid row {element!r}: {reason}")
        self._invalid.inc()
        yield pvalue.TaggedOutput(INVALID_TAG, Invalid(element, reason))


_CONFORM_ERRORS = (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, KeyError,
                   OverflowError)


def _without_uri(exc: Exception, uri: str) -> str:
    """``conform``'s message without the table's address in front."""
    return str(exc).replace(f"{uri}: ", "", 1)


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
        # (rows, bytes, key chunks, vector chunks, the key a row must beat).
        # Chunks are joined only when they reach twice the limit: joining on
        # every batch copied the whole sample per batch.
        return (0, 0, [], [], np.inf)

    def add_input(self, acc, table):
        rows, nbytes, keys, sample, bar = acc
        rows, nbytes = rows + table.num_rows, nbytes + table.nbytes
        if self._column is None or table.num_rows == 0:
            return rows, nbytes, keys, sample, bar
        u = np.random.random(table.num_rows)
        take = u < bar
        if take.any():
            column = table.select([self._column])
            if not take.all():
                column = column.filter(pa.array(take))
            keys.append(u[take])
            sample.append(vectors_of(column, self._column, self._dim))
            if sum(len(k) for k in keys) > 2 * self._limit:
                return (rows, nbytes) + self._compact(keys, sample)
        return rows, nbytes, keys, sample, bar

    def _compact(self, keys, sample):
        """The chunks as one chunk of at most ``limit`` rows, and the new bar."""
        keys = np.concatenate(keys) if keys else np.zeros(0, np.float64)
        sample = np.concatenate(sample) if sample else None
        if len(keys) <= self._limit:
            return [keys], [sample] if sample is not None else [], np.inf
        keep = np.argpartition(keys, self._limit - 1)[:self._limit]
        keys, sample = keys[keep], sample[keep]
        # Every row of the final sample has a key below the greatest kept now.
        return [keys], [sample], float(keys.max())

    def merge_accumulators(self, accs):
        accs = list(accs)
        rows = sum(a[0] for a in accs)
        nbytes = sum(a[1] for a in accs)
        keys = [k for a in accs for k in a[2]]
        sample = [x for a in accs for x in a[3]]
        return (rows, nbytes) + self._compact(keys, sample)

    def extract_output(self, acc):
        rows, nbytes, keys, sample, _ = acc
        if not sample:
            return rows, nbytes, None
        return rows, nbytes, self._compact(keys, sample)[1][0]


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
        vp = self._handle.properties.get("vector")
        rows = concat_conformed([p[0] for p in parts], self._table.open,
                                vp["column"] if vp else None)
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
        self._table.stage_done("build", str(shard))
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
        self._table.stage_done("commit", token)
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
