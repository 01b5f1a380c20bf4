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

import datetime
from typing import Callable, Optional, Sequence, Union

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms import trigger, window
from apache_beam.transforms.display import DisplayDataItem

from beam_supertable._moved import old_names
from beam_supertable.errors import NotATableError
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms.schema_merge import check_schema_mode
from beam_supertable.transforms.maintenance_stage import _Maintain, check_maintenance
from beam_supertable.transforms import write_checks as _checks
from beam_supertable.transforms import write_stages as _stages
from beam_supertable.transforms.write_checks import (
    Metric, OnInvalid, _check_arguments, _check_existing)
from beam_supertable.transforms.write_stages import (
    DEFAULT_BATCH_ROWS, DEFAULT_COMMIT_EVERY_S, DEFAULT_GRID_SAMPLE_ROWS, DEFAULT_STREAMING_SHARDS,
    INVALID_TAG, CommitResult, WriteResult, _BuildAndCommit, _Commit, _KeyByShard, _RunScope,
    _TableRef, _TagFloor, _ToBatches, build_superfiles)

__all__ = ["CommitResult", "WriteResult", "WriteToSupertable"]


class WriteToSupertable(beam.PTransform):
    """Writes rows to a supertable with exactly-once OCC commits.

    Example::

        commits = rows | WriteToSupertable("s3://bucket/docs", schema=schema,
                                           vector_column="emb", fts_columns=["body"])
        # commits: CommitResult(version, rows, superfiles, deduplicated), one per commit
        result = rows | WriteToSupertable(...).with_invalid_output()
        # result.commits, and result.invalid: Invalid(row, reason) for rows that do not fit

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
        schema_mode: ``"strict"`` (the default): a row with a column the table
            lacks is invalid. ``"merge"``: the column is added to the table
            (one schema commit, see ``Supertable.add_columns``; workers racing
            to add it agree; another type for it fails the job naming it).
        grid_sample_rows: bounded input: vectors sampled to train the first grid.
        on_stage: a hook called on the worker after each stage's side effects:
            ``("build", shard)`` once a superfile is uploaded, ``("commit",
            token)`` once its commit landed. An exception it raises fails
            that bundle exactly as a crash at that point would, so a test
            can check that a retry neither loses nor doubles a row (see
            ``beam_supertable.testing.FailFirstAttempt``). It is pickled
            with the pipeline: use a picklable callable.
        auto_compact: compact behind the commits (``optimize``, on a
            background thread: commits never wait) once this many superfiles
            are small (under half the target size); ``True`` is 64. Off
            (None) by default. See :mod:`beam_supertable.transforms.maintenance_stage`.
        vacuum_every: vacuum behind the commits once per this much processing
            time (seconds or ``timedelta``), keeping ``vacuum_retain_versions``
            versions and a ``vacuum_older_than`` grace (default 6 hours: it
            protects commits in flight). Off (None) by default.

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
                 on_stage: Optional[Callable[[str, str], None]] = None,
                 label: Optional[str] = None,
                 auto_compact: Union[bool, int, None] = None,
                 vacuum_every: Union[float, datetime.timedelta, None] = None,
                 vacuum_retain_versions: int = 10,
                 vacuum_older_than: Union[float, datetime.timedelta, None] = None,
                 schema_mode: str = "strict") -> None:
        super().__init__(label)
        self._schema_mode = check_schema_mode("WriteToSupertable", schema_mode)
        self._maintenance = check_maintenance("WriteToSupertable", auto_compact, vacuum_every,
                                              vacuum_retain_versions, vacuum_older_than)
        _check_arguments(uri=uri, schema=schema, vector_column=vector_column, metric=metric,
                         fts_columns=fts_columns, n_cells=n_cells, n_shards=n_shards,
                         storage_options=storage_options, on_invalid=on_invalid,
                         commit_every=commit_every, job_id=job_id,
                         replica_factor=replica_factor, batch_rows=batch_rows,
                         grid_sample_rows=grid_sample_rows)
        if on_stage is not None and (not callable(on_stage) or isinstance(on_stage, type)):
            raise TypeError(f"WriteToSupertable: on_stage must be a callable (an instance, "
                            f"not a class) or None, got {on_stage!r}")
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
            # (In merge mode the table may have gained columns since the schema was written.)
            _check_existing(table, None if self._schema_mode == "merge" else schema, {
                "vector_column": vector_column, "metric": metric, "fts_columns": fts,
                "n_cells": n_cells, "replica_factor": replica_factor})
            self._table = _TableRef(uri, storage_options, on_stage=on_stage)
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
        self._table = _TableRef(uri, storage_options, create, on_stage=on_stage)
        self._table.merge = self._schema_mode == "merge"
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
                   | "Conform" >> beam.ParDo(_ToBatches(self._table, self._on_invalid,
                                                         self._schema_mode))
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
        if self._maintenance[0] is not None or self._maintenance[1] is not None:
            commits = commits | "Maintain" >> beam.ParDo(
                _Maintain(self._uri, self._options, *self._maintenance)
            ).with_output_types(CommitResult)
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

        ``invalid`` holds ``beam_upsert.Invalid(row, reason)`` for every row
        that does not fit the schema (they are dropped and counted either
        way), as ``UpsertToSupertable``'s ``invalid`` does for commands. An
        ``Invalid`` is a 2-tuple: ``row, reason = bad`` works as it did when
        these were plain tuples. The reason names the row (by its ``id`` or
        ``*_id`` column when the table has one, else by its position in the
        batch a worker conformed, or in its RecordBatch), the column, what
        the table expects and what the row holds, e.g. ``row 3: column
        'reading' expects int64, got str 'abc'``. ``beam_upsert.invalid_to_json``
        writes one as a line of JSON.
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


# Defined in other modules; public under this module's name (repr, pickles).
for _public in (CommitResult, WriteResult,):
    _public.__module__ = __name__
del _public


# Names this module re-exported before the package's folders.
__getattr__ = old_names(__name__, (_checks.__name__, _stages.__name__))
