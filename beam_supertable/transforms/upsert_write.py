"""``UpsertToSupertable``: upsert commands applied to a keyed supertable, the loop closed.

The table is the upsert operator's persisted state. The pipeline pins one
version of the table when it starts (creating the table when it is absent and
``schema`` and ``primary_key`` are given): its ``frontier`` is the resume
frontier (commands below it are already applied: they are dropped and
counted ``beam_upsert/dropped_before_resume``), and its live rows are the
prior values, read back by key for just the keys the commands touch
(:class:`beam_supertable.table.lookup.KeyLookup`: key statistics, key sections,
then only the matched rows). Each key's commands are applied on top of its
prior with the per-key rule every ``beam_upsert`` flavor shares
(:func:`beam_upsert.model.apply_times`), so the changelog semantics are
``Upsert``'s exactly.

Bounded input, grouped flavor: each bundle's commands go to the shuffle as
one list per key shard (``GROUP_SHARDS``), so a runner's per-element shuffle
cost is paid per list; the apply step groups a shard's commands by key.
Validation takes no side input and fuses with the step that makes the
commands; the frontier drop happens after the shuffle.

Bounded input lands as ONE commit: the keys whose value changed are resolved
against the version the commit lands on (their live rows get deletion
vectors; ``Mutation``), the rows of the keys that hold a value afterwards go
in as new superfiles, and the commit records ``frontier`` = the greatest
command time applied + 1 µs. Superfiles are built in parallel workers by the
stages ``WriteToSupertable`` uses (``write.build_superfiles``: sharded by
vector cell, or at random), the commit step sees only their entries and the
changed keys. A rerun of the same batch finds every command
below the frontier and commits nothing; a crash before the commit leaves the
table as it was (the rerun does the work once); a crash after it leaves the
frontier past the batch (the rerun does nothing). A retried commit bundle of
one run finds its token and commits nothing twice.

Unbounded input: the stateful flavor applies each key's commands when the
watermark passes their time, with state and timers per state shard of keys
(``beam_upsert.stateful``'s design: a watermark timer per shard and command
time); the changed rows gather on one committer whose watermark timer fires
per ``COMMIT_SLOT_US`` of event time and commits every change up to the
slot's end, recording that end as the frontier: every change below it is in
the table. A restarted job resumes from the table's frontier. No stage of the
unbounded path takes a side input: each stateful stage pins its version in
its own (checkpointed) state, and commit tokens name the run and the slot, so
a job Flink restores from a checkpoint replays onto the same pin and finds
the commits it made after that checkpoint instead of making them twice.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms import window
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.utils.timestamp import Duration

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.keys import check_primary_key
from beam_supertable.format.schema import ID, vector_dim
from beam_supertable.transforms.maintenance_stage import _Maintain, check_maintenance
from beam_supertable.transforms.upsert_apply import (
    _ApplyGrouped, _ApplyStateful, _ByShard, _KeysToArrow, _LatestPerKey, _TimesAbove)
from beam_supertable.transforms.upsert_commit import _CommitBounded, _CommitStream
from beam_supertable.transforms.upsert_table import (  # noqa: F401 - the tunables, re-exported
    _TIMES_TAG,
    _UNSETTLED_TAG,
    ARROW_BATCH_ROWS,
    COMMIT_SLOT_US,
    FLAVORS,
    GRID_SAMPLE_ROWS,
    GROUP_SHARDS,
    INVALID_TAG,
    LOOKUP_BATCH_KEYS,
    METRICS,
    NAMESPACE,
    PUT,
    SHARD_PART_COMMANDS,
    VALIDATE_BATCH_ROWS,
    Flavor,
    _Pin,
    _ref,
    _Settings,
)
from beam_supertable.transforms.upsert_validate import _Settle, _Validate
from beam_supertable.transforms.schema_merge import check_schema_mode
from beam_supertable.transforms.write_stages import CommitResult, _ToBatches, build_superfiles
from beam_supertable.vector.metric import check_metric
from beam_upsert.model import retention_micros, retention_text
from beam_upsert.prepare import encode_key
from beam_upsert.stateful import DEFAULT_STATE_SHARDS, DEFAULT_TOMBSTONE_RETENTION_US, ShardKeys

__all__ = ["UpsertToSupertable", "UpsertWriteResult"]


_LOG = logging.getLogger(__name__)


class UpsertWriteResult(NamedTuple):
    """What ``UpsertToSupertable(...).with_invalid_output()`` returns.

    ``commits`` holds one :class:`CommitResult` per commit; ``invalid`` holds
    ``Invalid(element, reason)`` (a 2-tuple) per refused command.
    """

    commits: beam.PCollection
    invalid: beam.PCollection


# -- the transform --------------------------------------------------------------------------------
class UpsertToSupertable(beam.PTransform):
    """Applies upsert commands to a keyed supertable: the table is the upsert's state.

    Example::

        commits = commands | UpsertToSupertable(
            "s3://bucket/docs", schema=schema, primary_key="id", vector_column="emb")
        result = commands | UpsertToSupertable("s3://bucket/docs").with_invalid_output()
        # result.commits: CommitResult per commit; result.invalid: Invalid(element, reason)

    Input elements are the commands ``Upsert`` takes: ``(key, row | None,
    offset)`` (or ``UpsertCommand``), the element timestamp being the
    command's time. ``row`` is a dict of the table's columns whose key
    column(s) equal ``key`` (a tuple for a composite key); ``None`` deletes.

    Args:
        uri: the table (a keyed table; created when absent if ``schema`` and
            ``primary_key`` are given, inside the pipeline).
        schema: the user columns, to create the table; checked against an
            existing table's.
        primary_key: the key column(s), to create the table; checked against
            an existing table's.
        vector_column, metric, fts_columns: the indexes of a table created here.
        storage_options: fsspec options of the store.
        job_id: names the commits (in their tokens and metadata).
        flavor: ``"grouped"`` (bounded input), ``"stateful"`` (watermark
            timers; any input) or ``"auto"``: grouped for bounded input,
            stateful otherwise.
        state_shards: the stateful flavor's keys are hashed onto this many
            stateful keys (state and timers per shard, not per key; see
            ``beam_upsert.stateful``).
        tombstone_retention: how long, in event time, the stateful flavor
            keeps a deleted key's tombstone (its last applied time and
            offset), so a late command for it follows the offset rule: an
            apache_beam ``Duration`` or a number of seconds; default one
            hour, as ``Upsert``'s. A command for a key holding neither value
            nor tombstone at or below the newest tombstone its state shard
            dropped is refused as too late (``result.invalid``, counted
            ``beam_upsert/too_late``). ``0`` keeps every touched key's state
            for ever, without tombstone offsets (the behaviour before
            tombstones).
        n_cells: the vector grid size of a table created here (default:
            about sqrt(rows of the first commit); see ``Supertable.create``).
        n_shards: superfiles per bounded commit (default: by input size).
        auto_compact: compact behind the commits (``optimize``, on a
            background thread: commits never wait) once this many superfiles
            are small (under half the target size); ``True`` is 64. Off
            (None) by default. See :mod:`beam_supertable.transforms.maintenance_stage`.
        vacuum_every: vacuum behind the commits once per this much processing
            time (seconds or ``timedelta``), keeping ``vacuum_retain_versions``
            versions and a ``vacuum_older_than`` grace (default 6 hours: it
            protects commits in flight). Off (None) by default.
        schema_mode: ``"strict"`` (the default): a row with a column the table
            lacks is invalid. ``"merge"``: the column is added to the table
            first (one schema commit, see ``Supertable.add_columns``; workers
            racing to add it agree; another type for it fails the job naming
            it); a ``schema`` given then need not match the table's.

    Note:
        Bounded input lands as ONE commit recording ``frontier`` = the
        greatest command time applied + 1 µs; commands below the table's
        frontier when the pipeline starts are dropped (counted
        ``beam_upsert/dropped_before_resume``), so rerunning a batch commits
        nothing. Unbounded input commits once per ``COMMIT_SLOT_US`` of
        event time the watermark passes, recording the slot's end. Counters:
        ``beam_upsert/inserts|updates|deletes|invalid|dropped_before_resume``
        and ``beam_supertable/commits|rows_committed``. One job at a time
        per table: a commit whose frontier is below the table's (another
        job applied later commands meanwhile) fails with FrontierError and
        commits nothing.
    """

    def __init__(self, uri: str, schema: Optional[pa.Schema] = None,
                 primary_key: Union[str, Sequence[str], None] = None,
                 vector_column: Optional[str] = None, metric: str = "l2",
                 fts_columns: Sequence[str] = (), storage_options: Optional[dict] = None,
                 job_id: Optional[str] = None, flavor: Flavor = "auto",
                 label: Optional[str] = None, *,
                 state_shards: int = DEFAULT_STATE_SHARDS,
                 tombstone_retention: Union[Duration, int, float] = Duration(
                     micros=DEFAULT_TOMBSTONE_RETENTION_US),
                 n_cells: Optional[int] = None, n_shards: Optional[int] = None,
                 auto_compact: Union[bool, int, None] = None,
                 vacuum_every: Union[float, datetime.timedelta, None] = None,
                 vacuum_retain_versions: int = 10,
                 vacuum_older_than: Union[float, datetime.timedelta, None] = None,
                 schema_mode: str = "strict") -> None:
        super().__init__(label)
        where = "UpsertToSupertable"
        check_schema_mode(where, schema_mode)
        self._maintenance = check_maintenance(where, auto_compact, vacuum_every,
                                              vacuum_retain_versions, vacuum_older_than)
        if not isinstance(uri, str) or not uri:
            raise ValueError(f"{where}: uri must be a non-empty str, got {uri!r}")
        if flavor not in FLAVORS:
            raise ValueError(f"{where}: flavor must be one of {FLAVORS}, got {flavor!r}")
        if metric not in METRICS:
            raise ValueError(f"{where}: metric must be one of {METRICS}, got {metric!r}")
        if not isinstance(state_shards, int) or isinstance(state_shards, bool) \
                or state_shards < 1:
            raise ValueError(f"{where}: state_shards must be a positive int, got "
                             f"{state_shards!r}")
        retention = retention_micros(tombstone_retention, where=where)
        for name, value in (("n_cells", n_cells), ("n_shards", n_shards)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{where}: {name} must be a positive int, got {value!r}")
        check_metric(metric)
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise ValueError(f"{where}: job_id must be a non-empty str, got {job_id!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise TypeError(f"{where}: schema must be a pyarrow.Schema, got "
                            f"{type(schema).__name__}")
        if isinstance(fts_columns, str):
            fts_columns = [fts_columns]
        names = None
        if primary_key is not None:
            if not isinstance(primary_key, (str, list, tuple)):
                raise SchemaMismatchError(f"{where}: primary_key must be a column name or a "
                                          f"list of them, got {primary_key!r}")
            names = [primary_key] if isinstance(primary_key, str) else list(primary_key)
            if not names:
                raise ValueError(f"{where}: primary_key must name at least one column")
        if schema is not None:
            if ID in schema.names:
                raise SchemaMismatchError(f"{where}: column {ID!r} is reserved for row ids")
            if names:
                check_primary_key(uri, schema, names)
            for column in ([vector_column] if vector_column else []) + list(fts_columns):
                if column not in schema.names:
                    raise SchemaMismatchError(
                        f"{where}: column {column!r} is not in the schema {schema.names}")
            if vector_column:
                vector_dim(schema.field(vector_column))
        self._settings = _Settings(uri, storage_options, schema, names, vector_column, metric,
                                   tuple(fts_columns), job_id, n_cells, schema_mode)
        self._n_shards = n_shards
        self._flavor = flavor
        self._state_shards = state_shards
        self._retention_micros = retention
        self._with_invalid = False

    def with_invalid_output(self) -> "UpsertToSupertable":
        """Makes the transform return ``UpsertWriteResult(commits, invalid)``."""
        self._with_invalid = True
        return self

    def resolved_flavor(self, commands: beam.PCollection) -> str:
        """The flavor ``expand`` uses (resolves ``"auto"``)."""
        if self._flavor != "auto":
            return self._flavor
        return "grouped" if commands.is_bounded else "stateful"

    def expand(self, commands):
        s = self._settings
        bounded = commands.is_bounded
        flavor = self.resolved_flavor(commands)
        if flavor == "grouped" and not bounded:
            raise ValueError("UpsertToSupertable: flavor='grouped' needs bounded input; use "
                             "'stateful' or 'auto' for unbounded input")
        # Bounded input pins one version for the whole run (a side input).
        # Unbounded input has no side input: one from a one-element source
        # does not survive Flink's restore from a checkpoint (its source has
        # finished; the restored job sees it empty), so the stateful stages
        # pin for themselves (_stream_pin) and the run is named here, once
        # for every restart of the job.
        pin = beam.pvalue.AsSingleton(
            commands.pipeline | "Start" >> beam.Create([None])
            | "Pin" >> beam.ParDo(_Pin(s))) if bounded else None
        run = uuid.uuid4().hex
        if not isinstance(commands.windowing.windowfn, window.GlobalWindows):
            # An upsert is per key over all time: windowing must not split it.
            commands = commands | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        checked = commands | "Validate" >> beam.ParDo(_Validate(s)).with_outputs(
            INVALID_TAG, _UNSETTLED_TAG, main="commands")
        invalid = [checked[INVALID_TAG],
                   checked[_UNSETTLED_TAG] | "Settle" >> beam.ParDo(_Settle(), pin)]
        # Keys are the encoded bytes (beam_upsert.prepare): say so, so keyed
        # state and grouping use a deterministic bytes coder.
        keyed = checked.commands | "Keyed" >> beam.WindowInto(
            window.GlobalWindows()).with_output_types(Tuple[bytes, Any])
        if flavor == "grouped":
            applied = (keyed
                       | "ByShard" >> beam.ParDo(_ByShard()).with_output_types(Tuple[int, Any])
                       | "GroupKeyShards" >> beam.GroupByKey()
                       | "Apply" >> beam.ParDo(_ApplyGrouped(s), pin).with_outputs(
                           INVALID_TAG, _TIMES_TAG, main="changes"))
            times = applied[_TIMES_TAG]
        else:
            applied = (keyed
                       | "Shard" >> beam.ParDo(ShardKeys(self._state_shards)).with_output_types(
                           Tuple[int, Any])
                       | "Apply" >> beam.ParDo(_ApplyStateful(s, run, self._retention_micros)).with_outputs(
                           INVALID_TAG, main="changes"))
            # Bounded input: the frontier is the greatest time applied, so
            # commands below the pinned frontier (already in) do not count.
            times = keyed | "Times" >> beam.ParDo(_TimesAbove(), pin) if bounded else None
        invalid.append(applied[INVALID_TAG])
        changes = applied.changes
        if bounded:
            if flavor == "stateful":
                changes = (changes
                           | "ByKey" >> beam.Map(
                               lambda c, ts=beam.DoFn.TimestampParam:
                               (encode_key(c[1]), (ts.micros, c)))
                           | "GroupChanges" >> beam.GroupByKey()
                           | "Latest" >> beam.ParDo(_LatestPerKey()))
            commits = self._commit_bounded(times, changes, pin)
        else:
            commits = (changes
                       | "OneKey" >> beam.Map(lambda c: (0, c)).with_output_types(
                           Tuple[int, Any])
                       | "Commit" >> beam.ParDo(_CommitStream(s, run)).with_output_types(
                           CommitResult))
        if self._maintenance[0] is not None or self._maintenance[1] is not None:
            commits = commits | "Maintain" >> beam.ParDo(
                _Maintain(s.uri, s.storage_options, *self._maintenance)
            ).with_output_types(CommitResult)
        if not self._with_invalid:
            return commits
        return UpsertWriteResult(commits, tuple(invalid) | "Invalid" >> beam.Flatten())

    def _commit_bounded(self, times, changes, pin):
        s = self._settings
        ref = _ref(s)
        rows = (changes
                | "Puts" >> beam.FlatMap(lambda c: [c[2]] if c[0] == PUT else [])
                | "BatchRows" >> beam.BatchElements(min_batch_size=1,
                                                    max_batch_size=ARROW_BATCH_ROWS)
                | "RowsToArrow" >> beam.ParDo(_ToBatches(ref, on_invalid="fail",
                                                             schema_mode=s.schema_mode)))
        # The rows are canonical already: conforming them cannot fail.
        _, built = build_superfiles(rows, ref, self._n_shards, GRID_SAMPLE_ROWS, pin)
        keys = (changes
                | "Keys" >> beam.Map(lambda c: c[1])
                | "BatchKeys" >> beam.BatchElements(min_batch_size=1,
                                                    max_batch_size=ARROW_BATCH_ROWS * 4)
                | "KeysToArrow" >> beam.ParDo(_KeysToArrow(s), pin))
        greatest = times | "Greatest" >> beam.CombineGlobally(max).without_defaults()
        return greatest | "Commit" >> beam.ParDo(
            _CommitBounded(s), pin, beam.pvalue.AsList(built), beam.pvalue.AsList(keys)
        ).with_output_types(CommitResult)

    def display_data(self):
        s = self._settings
        return {
            "uri": DisplayDataItem(s.uri, label="Table"),
            "primary_key": DisplayDataItem(", ".join(s.primary_key or ()) or "(the table's)",
                                           label="Primary key"),
            "flavor": DisplayDataItem(self._flavor, label="Flavor"),
            "state_shards": DisplayDataItem(self._state_shards, label="State shards"),
            "tombstone_retention": DisplayDataItem(retention_text(self._retention_micros),
                                                   label="Tombstone retention"),
            "job_id": DisplayDataItem(s.job_id or "(one per run)", label="Job id"),
            "vector_column": DisplayDataItem(s.vector_column or "", label="Vector column"),
            "metric": DisplayDataItem(s.metric, label="Metric"),
        }
