"""``ReadChangesFromSupertable``: a table's changes as a Beam retraction changelog.

Each element is a :class:`beam_upsert.Change` ``(key, row, diff)`` timestamped
at the commit time of the version that made it: the key is the primary key on
a keyed table (a tuple for a composite key) and ``_id`` otherwise, ``row`` a
dict of the user columns asked for. See :meth:`Supertable.changes
<beam_supertable.table.supertable.Supertable.changes>` for what a version's changes are.

Bounded (an ``end_version`` the table has reached): the versions' units
(a new superfile's insertions, one superfile's retractions) are planned once and
read in parallel, one unit per element.

Tailing (no ``end_version``, or one not reached yet): one stateful reader
whose state is the next version to emit, driven by a chain of event-time timers.
Each firing emits the versions that have landed, in order (so each key's changes
arrive in version order), or waits ``poll_interval`` when none has. A runner
that checkpoints state and timers (Flink) restarts at the first version not yet
emitted: none is lost, none repeated. The watermark follows commit times; while
the table is idle it follows the wall clock, since a version committed later
carries a later time (an element is never stamped below the watermark: a
version whose writer's clock is behind is stamped at the watermark).

Named (``consumer="..."``): the read is the tailing reader's, bounded or not,
and it records in the table (:mod:`beam_supertable.format.consumers`) the last
version it emitted ``SETTLE_S`` seconds ago or more, when the runner finalizes
the bundle that carried it: on Flink once the checkpoint that covers it
completes, on the DirectRunner when the bundle ends. The settling time is the
sink's: a runner that keeps no state across a crash (the DirectRunner) loses
what the stages after the reader held, and a restart from the record replays
the versions emitted during the last ``SETTLE_S`` seconds instead of skipping
what a sink had not committed yet. A sink that drops what it already applied
(``UpsertToSupertable``, below its frontier) ends with every change once; on
Flink the restored reader resumes from its checkpointed state, not the record.
Vacuum keeps every version from the record on, and a new run of the pipeline
resumes there instead of at ``start_version``. A reader records its version
again at least every ``HEARTBEAT_S`` while it runs, so a live reader of a quiet
table does not expire.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Dict, Optional, Sequence, Union

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from beam_supertable.errors import CorruptManifestError, VersionNotFoundError
from beam_supertable.format import consumers as named
from beam_supertable.format.schema import ID
from beam_supertable.table import changes as feed
from beam_supertable.table import consumers as feed_consumers
from beam_supertable.table.supertable import Supertable
from beam_upsert.model import Change

__all__ = ["DEFAULT_POLL_INTERVAL", "ReadChangesFromSupertable"]

_LOG = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 1.0   # seconds between looks for a new version while tailing
VERSIONS_PER_FIRING = 16      # versions one timer firing emits at most while catching up
NAMESPACE = "beam_supertable"
LATEST = "latest"
PROGRESS = "progress"         # the tailing reader's output of versions emitted, for a consumer
HEARTBEAT_S = 60.0            # a named reader records its version again at least this often
SETTLE_S = 10.0               # a version is recorded once it has been out this long


class _Settings:
    """What every stage needs: where the table is and what to read of it."""

    def __init__(self, uri, storage_options, columns, filter, row_columns,  # noqa: A002
                 primary_key, schema, consumer=None) -> None:
        self.uri, self.storage_options, self.schema = uri, storage_options, schema
        self.consumer = consumer
        self.columns, self.filter = list(columns), filter
        self.row_columns, self.primary_key = list(row_columns), list(primary_key)

    def open(self) -> Supertable:
        return Supertable.open(self.uri, storage_options=self.storage_options)


def _changes_of(table: pa.Table, settings: _Settings):
    """``Change`` s of change rows (``feed.read_unit``'s output), in their order."""
    # (A tailing read's rows carry each version's schema: a column renamed or
    # dropped since the read was built is not there.)
    rows = table.select([c for c in settings.row_columns if c in table.column_names]).to_pylist()
    if settings.primary_key:
        parts = [table.column(c).to_pylist() for c in settings.primary_key]
        keys = parts[0] if len(parts) == 1 else list(zip(*parts))
    else:
        keys = table.column(ID).to_pylist()
    diffs = table.column(feed.CHANGE).to_pylist()
    for key, row, diff in zip(keys, rows, diffs):
        yield Change(key, row, diff)


class _PlanUnits(beam.DoFn):
    def __init__(self, settings: _Settings, start: int, end: int) -> None:
        self._s, self._start, self._end = settings, start, end

    def process(self, _):
        table = self._s.open()
        first = feed.load(table, self._start)
        floor = feed.commit_micros(first)
        for after, units in feed.plan(table, self._start, self._end, first,
                                      self._s.filter is not None):
            # Times never go back with the version (a writer's clock may be behind).
            floor = max(floor, feed.commit_micros(after))
            for unit in units:
                yield {**unit, "timestamp": floor}


class _ReadUnits(beam.DoFn):
    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._table = self._s.open()
        self._count = Metrics.counter(NAMESPACE, "changes_read")

    def process(self, unit):
        # The range's schema, not the latest version's (an overwrite may have changed it).
        rows = feed.read_unit(self._table, unit, self._s.schema, self._s.columns,
                              self._s.filter)
        stamp = Timestamp(micros=unit["timestamp"])
        self._count.inc(rows.num_rows)
        for change in _changes_of(rows, self._s):
            yield TimestampedValue(change, stamp)


class _TailChanges(beam.DoFn):
    """Polls the table and emits each new version's changes, in version order.

    One stateful key. Its state is the next version to emit; a chain of
    event-time timers drives the polling: each firing emits the versions that
    have landed (at most ``VERSIONS_PER_FIRING``, so checkpoints pass between
    firings), or waits ``poll_interval`` once when none has, then sets the
    next timer. The timer's time holds the output watermark: it is the commit
    time of the last version emitted, or the wall clock while the table is
    idle. (Event-time timers, not a splittable DoFn's deferred remainder nor
    processing-time timers: behind an Impulse the input watermark is +inf at
    once, and portable Flink resumes neither of those then.)
    """

    NEXT = ReadModifyWriteStateSpec("next_version", coders.VarIntCoder())
    TICK = TimerSpec("poll", TimeDomain.WATERMARK)

    def __init__(self, settings: _Settings, start: int, end: Optional[int],
                 poll_interval: float) -> None:
        self._s, self._start, self._end, self._poll = settings, start, end, poll_interval

    def setup(self):
        self._table = self._s.open()
        self._before = None   # the last version emitted: the next one's predecessor
        self._told = time.monotonic()   # when a version was last sent to be recorded
        self._count = Metrics.counter(NAMESPACE, "changes_read")
        self._landed = Metrics.counter(NAMESPACE, "versions_read")

    def process(self, element, next_version=beam.DoFn.StateParam(NEXT),
                tick=beam.DoFn.TimerParam(TICK)):
        if next_version.read() is None:
            next_version.write(self._start + 1)
            tick.set(Timestamp(micros=feed.commit_micros(feed.load(self._table, self._start))),
                     dynamic_timer_tag="0")

    @on_timer(TICK)
    def poll(self, fired=beam.DoFn.TimestampParam, tag=beam.DoFn.DynamicTimerTagParam,
             next_version=beam.DoFn.StateParam(NEXT), tick=beam.DoFn.TimerParam(TICK)):
        version, floor = next_version.read(), fired
        manifest = self._table.snapshot.manifest
        doc = manifest._try_version(version)
        if doc is None:
            time.sleep(self._poll)
            doc = manifest._try_version(version)
        if doc is None:
            self._check_not_vacuumed(manifest, version)
        idle = doc is None
        for _ in range(VERSIONS_PER_FIRING):
            if doc is None or (self._end is not None and version > self._end):
                break
            after = manifest._snapshot(doc)
            stamp = max(floor, Timestamp(micros=feed.commit_micros(after)))
            yield from self._emit(after, stamp)
            floor, version = stamp, version + 1
            doc = manifest._try_version(version)
        next_version.write(version)
        done = self._end is not None and version > self._end
        if self._s.consumer is not None and (
                not idle or time.monotonic() - self._told >= SETTLE_S / 2):
            # Idle, it still reports now and then: the record catches up with
            # the last version out once that has settled.
            self._told = time.monotonic()
            yield TaggedOutput(PROGRESS, (version - 1, done))
        if done:
            return   # every version asked for is out
        # Idle: a version committed from now on carries a later time.
        now = Timestamp(micros=int(time.time() * 1_000_000))
        at = max(floor + Duration(micros=1), now if idle else floor)
        tick.set(at, dynamic_timer_tag=str(int(tag) + 1))

    def _check_not_vacuumed(self, manifest, version: int) -> None:
        """Raises when ``version`` is missing because vacuum removed it, not because it
        is not committed yet: versions are created in order, so a later one tells."""
        if manifest.latest_version() < version or manifest._try_version(version) is not None:
            return
        listed = manifest._listed_versions()
        oldest = listed[0] if listed else None
        raise VersionNotFoundError(
            f"{self._table.uri}: read changes: version {version}, the next this reader needs, "
            f"was removed by vacuum; the oldest version still readable is {oldest}. Resume "
            f"from a snapshot: read version {oldest} (ReadFromSupertable(..., "
            f"version={oldest})) and tail its changes with start_version={oldest}; a "
            f"reader given a consumer name is never left behind this way")

    def _emit(self, after, stamp):
        before = self._before
        if before is None or before.version != after.version - 1:
            before = feed.load(self._table, after.version - 1)
        for unit in feed.version_units(before, after, self._s.filter is not None):
            # Each version's rows carry its own schema (columns renamed or
            # dropped since the read was built are left out).
            rows = feed.read_unit(self._table, unit, after.schema,
                                  [c for c in self._s.columns if c in after.schema.names],
                                  self._s.filter)
            self._count.inc(rows.num_rows)
            for change in _changes_of(rows, self._s):
                yield TimestampedValue(change, stamp)
        self._landed.inc()
        self._before = after


class _RecordProgress(beam.DoFn):
    """Records a named consumer's version: the greatest one emitted ``SETTLE_S``
    seconds ago or more, once the runner finalizes the bundle that reported it
    (after the covering checkpoint on Flink). The last version of a read with an
    end is recorded when it has settled too: the finalizer waits out the rest."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._table = self._s.open()
        self._pending = collections.deque()   # (when reported, version), oldest first
        self._written = (float("-inf"), None)   # (when, version) this reader last recorded
        self._dropped = False

    def start_bundle(self):
        self._bundle = None   # [version, settles at]: what this bundle's callback records

    def process(self, progress, finalizer=beam.DoFn.BundleFinalizerParam):
        version, last = progress
        now = time.monotonic()
        self._pending.append((now, version))
        # The last version of a read with an end settles from now: its callback waits.
        settled, due = None, now + SETTLE_S if last else now
        while self._pending and (last or self._pending[0][0] <= now - SETTLE_S):
            settled = self._pending.popleft()[1]
        if settled is None and self._written[1] is not None \
                and now - self._written[0] >= HEARTBEAT_S:
            settled = self._written[1]   # nothing new has settled: keep the record alive
        if settled is None or (settled == self._written[1]
                               and now - self._written[0] < HEARTBEAT_S):
            return
        self._written = (now, settled)
        if self._bundle is None:
            held = self._bundle = [settled, due]
            finalizer.register(lambda: self._record(*held))
        self._bundle[0] = max(self._bundle[0], settled)
        self._bundle[1] = max(self._bundle[1], due)

    def _record(self, version: int, due: float) -> None:
        time.sleep(max(0.0, due - time.monotonic()))
        store, name = self._table.store, self._s.consumer
        try:
            held = named.recorded(store, name)
        except CorruptManifestError:
            held = -1   # unreadable: this reader's record replaces it
        if held is None:
            # Dropped while this reader runs: it is not brought back (vacuum no
            # longer waits for this reader, which fails if it falls behind one).
            if not self._dropped:
                self._dropped = True
                _LOG.warning("%s: consumer %r was dropped while its reader ran; its "
                             "position is no longer recorded", self._s.uri, name)
            return
        # Written even below what is recorded: a job restored from an older
        # checkpoint or savepoint needs the versions from its own position on.
        named.record(store, name, version, self._table.snapshot.manifest.clock())


class ReadChangesFromSupertable(beam.PTransform):
    """A table's changes from ``start_version`` on, as ``Change(key, row, diff)``.

    Example::

        changed = (p | ReadChangesFromSupertable("s3://bucket/chunks", start_version=41)
                     | beam.Filter(lambda c: c.diff > 0))      # rows to re-embed

    Args:
        uri: the table.
        start_version: the changes start after this version (exclusive).
        end_version: the last version read. An int the table has reached (or
            ``"latest"``: the latest when the pipeline is built) makes the
            read bounded and parallel by superfile; ``None`` tails the table
            for ever, emitting each version's changes once as it lands; an int
            beyond the latest tails until that version has been emitted.
        columns: user columns each row carries (default: all). The key
            columns of a keyed table are read whether asked for or not.
        filter: a pyarrow expression changed rows must satisfy (superfiles
            are skipped by their statistics).
        poll_interval: seconds between looks for a new version while tailing.
        storage_options: fsspec options of the store.
        consumer: a name under which the table records how far this reader
            has emitted (letters, digits, ``.``, ``_``, ``-``): the last
            version out for ``SETTLE_S`` seconds, so a sink has committed it.
            Built for the first time, it registers at ``start_version``; built
            again (a restarted job), it resumes after the version it recorded,
            and ``start_version`` may be omitted. Vacuum never removes a version
            a live consumer still needs. See ``Supertable.consumers``.

    Raises (when the pipeline is built):
        VersionNotFoundError: ``start_version`` (or the consumer's version) was
            vacuumed (the message names the oldest version still readable) or
            does not exist yet.
        ValueError: ``start_version > end_version``, a bad ``poll_interval``,
            a bad consumer name, no ``start_version`` for a new consumer.
        SchemaMismatchError: an unknown column.
    """

    def __init__(self, uri: str, *, start_version: Optional[int] = None,
                 end_version: Union[int, str, None] = None,
                 columns: Optional[Sequence[str]] = None,
                 filter: Optional[pc.Expression] = None,  # noqa: A002
                 poll_interval: float = DEFAULT_POLL_INTERVAL,
                 storage_options: Optional[dict] = None, label: Optional[str] = None,
                 consumer: Optional[str] = None) -> None:
        super().__init__(label)
        where = "ReadChangesFromSupertable"
        if consumer is not None:
            named.check_name(consumer)
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) \
                or not 0 < poll_interval < 86_400:
            raise ValueError(f"{where}: poll_interval must be a number of seconds > 0 and "
                             f"under a day, got {poll_interval!r}")
        if filter is not None and not isinstance(filter, pc.Expression):
            raise TypeError(f"{where}: filter must be a pyarrow.compute.Expression, got "
                            f"{type(filter).__name__}")
        table = Supertable.open(uri, storage_options=storage_options)
        latest = table.version
        if end_version == LATEST:
            end_version = latest
        known = behind = False
        if consumer is not None:
            start_version, known = feed_consumers.resume(table, consumer, start_version, where)
            # It has read past the end asked for: nothing to read, and its record stays.
            behind = known and isinstance(end_version, int) \
                and not isinstance(end_version, bool) and 0 <= end_version < start_version
        for name, value in (("start_version", start_version), ("end_version", end_version)):
            if (value is not None or name == "start_version") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{where}: {name} must be an int >= 0"
                                 + (f", {LATEST!r} or None" if name == "end_version" else "")
                                 + f", got {value!r}")
        if start_version > latest:
            raise VersionNotFoundError(f"{where}: {uri}: start_version {start_version} does "
                                       f"not exist yet (the latest version is {latest})")
        if not behind:
            feed.versions_between(table, start_version,
                                  latest if end_version is None else min(end_version, latest))
        # A vacuumed start is refused here; a reader with nothing left checks its
        # columns and filter against the latest version.
        start = feed.load(table, latest if behind else start_version)
        if isinstance(end_version, int) and not isinstance(end_version, bool) \
                and start_version <= end_version <= latest and not behind:
            # A bounded read's rows carry the schema of its range's end.
            start = dataclasses.replace(start, schema=feed.load(table, end_version).schema)
        if isinstance(columns, str):
            columns = [columns]
        names = feed.change_columns(start, columns)
        feed.check_filter(start.schema, filter)
        key = list(start.properties.get("primary_key") or [])
        read = names + [c for c in key if c not in names]
        row_columns = list(columns) if columns is not None else names
        self._settings = _Settings(uri, storage_options, read, filter, row_columns, key,
                                   start.schema, consumer)
        self._start, self._end, self._latest = start_version, end_version, latest
        self._behind = behind
        self._poll = float(poll_interval)
        if consumer is not None and not known:
            feed_consumers.register(table, consumer, start_version, where)

    @property
    def bounded(self) -> bool:
        """Whether the read ends by itself with versions the table had when it was built."""
        return self._end is not None and self._end <= self._latest

    def expand(self, pbegin):
        if self._behind:
            return pbegin | "Nothing" >> beam.Create([]).with_output_types(Change)
        if self.bounded and self._settings.consumer is None:
            return (pbegin
                    | "Start" >> beam.Create([None])
                    | "PlanUnits" >> beam.ParDo(_PlanUnits(self._settings, self._start, self._end))
                    | "Spread" >> beam.Reshuffle()
                    | "ReadUnits" >> beam.ParDo(_ReadUnits(self._settings)))
        tail = beam.ParDo(_TailChanges(self._settings, self._start, self._end, self._poll))
        start = pbegin | "Start" >> beam.Create([("tail", None)])
        if self._settings.consumer is None:
            changes = start | "Tail" >> tail
        else:
            out = start | "Tail" >> tail.with_outputs(PROGRESS, main="changes")
            _ = out[PROGRESS] | "RecordProgress" >> beam.ParDo(_RecordProgress(self._settings))
            changes = out.changes
        if not self.bounded:
            changes.is_bounded = False   # it arrives as the table's versions land
        return changes

    def display_data(self) -> Dict[str, Any]:
        return {"uri": DisplayDataItem(self._settings.uri, label="Table"),
                "start_version": DisplayDataItem(self._start, label="Start version (exclusive)"),
                "end_version": DisplayDataItem(
                    "(tail)" if self._end is None else self._end, label="End version"),
                "columns": DisplayDataItem(", ".join(self._settings.row_columns),
                                           label="Columns"),
                "consumer": DisplayDataItem(self._settings.consumer or "(none)",
                                            label="Consumer")}

