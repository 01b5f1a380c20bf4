"""``UpsertToSupertable``'s commit: the changed keys and their new rows, one
commit per batch (bounded) or per event-time slot (unbounded)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import apache_beam as beam
import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer)
from apache_beam.utils.timestamp import Timestamp

from beam_supertable.format.keys import KeyBatch
from beam_supertable.table.mutation import Mutation
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms.upsert_table import (
    COMMIT_SLOT_US, NAMESPACE, PUT, _key_table, _Settings, _stream_pin, _stream_token)
from beam_supertable.transforms.write_stages import CommitResult


def _commit(settings: _Settings, *, entries: List[dict], keys: Optional[pa.Table],
            frontier: int, token: str, base_version: int,
            stamp: Optional[dict], metadata: Optional[dict] = None) -> Optional[CommitResult]:
    """One upsert commit: new superfiles plus deletion vectors for the changed keys.

    Returns:
        The CommitResult, or None when nothing was committed (no change and
        the frontier already there).
    """
    table = Supertable.open(settings.uri, storage_options=settings.storage_options)
    batch = KeyBatch(keys, table.primary_key) if keys is not None and keys.num_rows else None
    entries = sorted(entries, key=lambda e: e["id"])
    metadata = {"job": settings.job_id or token.rsplit("/", 1)[0], **(metadata or {})}
    before = table.version
    mutation = Mutation(table, "upsert", keys=batch, frontier=frontier, token=token,
                        metadata=metadata, base_version=base_version)
    # The table's one write path: a grid another writer stamped first gets
    # these superfiles rebuilt on it (same _ids), inside the commit loop.
    version = table.commit_superfiles(entries, mutation, grids=[stamp] if stamp else ())
    deduplicated = table.snapshot.deduplicated
    if version == before and not deduplicated:
        return None
    return CommitResult(version, sum(e["rows"] for e in entries), len(entries), deduplicated)


class _CommitBounded(beam.DoFn):
    """Bounded input: the whole changelog as one commit (element: the greatest time)."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._commits = Metrics.counter(NAMESPACE, "commits")
        self._rows = Metrics.counter(NAMESPACE, "rows_committed")
        self._deduplicated = Metrics.counter(NAMESPACE, "deduplicated_commits")

    def process(self, greatest, pin=None, built=(), keys=()):
        keys = [k for k in keys if k.num_rows]
        result = _commit(self._s, entries=[entry for entry, _ in built],
                         keys=pa.concat_tables(keys) if keys else None,
                         frontier=int(greatest) + 1,
                         token=f"{self._s.job_id or 'upsert'}/{pin['run']}",
                         base_version=pin["version"],
                         # Every superfile is on the plan's grid.
                         stamp=next((grid for _, grid in built if grid), None))
        if result is None:
            return
        if result.deduplicated:
            self._deduplicated.inc()
        else:
            self._commits.inc()
            self._rows.inc(result.rows)
        yield result


# -- committing per firing (unbounded) ---------------------------------------------------------


class _CommitStream(beam.DoFn):
    """Unbounded input: every change up to a slot's end, once the watermark passes it.

    All changes gather on one key; a watermark timer per ``COMMIT_SLOT_US``
    of event time commits the changes up to the slot's end (the last one of
    each key) and records the slot's end as the frontier. The commit's
    token names the run (fixed when the pipeline is built, so the same
    across Flink restarts) and the slot: a slot committed after the
    checkpoint a restarted job restores from finds its token and commits
    nothing twice. Each commit records the version the run started on
    (``start_version``), where a stage pinning after a restore reads from.
    A late change, in a slot the run committed already, is committed with
    the first slot above the run's frontier (a slot's token names one
    commit).
    """

    BUFFER = BagStateSpec("buffer", coders.FastPrimitivesCoder())
    PIN = ReadModifyWriteStateSpec("pin", coders.FastPrimitivesCoder())
    FRONT = ReadModifyWriteStateSpec("front", coders.FastPrimitivesCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def __init__(self, settings: _Settings, run: str) -> None:
        self._s = settings
        self._run = run

    def setup(self):
        self._commits = Metrics.counter(NAMESPACE, "commits")
        self._rows = Metrics.counter(NAMESPACE, "rows_committed")

    def start_bundle(self):
        self._set = set()      # slots whose timer this bundle set already
        self._pinned = False   # the pin is in state (it never changes once written)
        # The run's frontier as this bundle knows it, per key: read from state
        # once, then kept in step with the commits the bundle's timers make.
        self._fronts: Dict[Any, Optional[int]] = {}

    def process(self, element, ts=beam.DoFn.TimestampParam,
                buffer=beam.DoFn.StateParam(BUFFER), pinned=beam.DoFn.StateParam(PIN),
                front=beam.DoFn.StateParam(FRONT), flush=beam.DoFn.TimerParam(FLUSH)):
        kind, key, row = element[1]
        if not self._pinned:
            if pinned.read() is None:
                pinned.write(tuple(_stream_pin(self._s, self._run)))
            self._pinned = True
        micros = ts.micros
        buffer.add((micros, kind, key, row))
        slot_end = (micros // COMMIT_SLOT_US + 1) * COMMIT_SLOT_US
        if element[0] not in self._fronts:
            self._fronts[element[0]] = front.read()
        own = self._fronts[element[0]]
        if own is not None and slot_end <= own:
            # A late change (a late command applied at its key's time) in a
            # slot this run committed already, whose token is spent: it goes
            # with the first slot above the run's frontier.
            slot_end = (own // COMMIT_SLOT_US + 1) * COMMIT_SLOT_US
        if slot_end not in self._set:
            self._set.add(slot_end)
            flush.set(Timestamp(micros=slot_end - 1), dynamic_timer_tag=str(slot_end))

    @on_timer(FLUSH)
    def commit_due(self, key=beam.DoFn.KeyParam, tag=beam.DoFn.DynamicTimerTagParam,
                   buffer=beam.DoFn.StateParam(BUFFER), pinned=beam.DoFn.StateParam(PIN),
                   front=beam.DoFn.StateParam(FRONT), flush=beam.DoFn.TimerParam(FLUSH)):
        # The slot's end comes from the tag: Flink keeps timers in
        # milliseconds, so the firing's timestamp (the slot's end - 1 µs)
        # arrives as the slot's end - 1 ms, and the frontier recorded would
        # be 999 µs short of the DirectRunner's.
        now = int(tag) - 1
        self._set.discard(now + 1)
        own = front.read()
        if own is not None and now + 1 <= own:
            # This run committed the slot already, and its token is spent: a
            # change that arrived after that firing (a bundle that read the
            # frontier before the firing wrote it, on a runner that runs them
            # side by side) goes with the first slot above the frontier.
            after = (own // COMMIT_SLOT_US + 1) * COMMIT_SLOT_US
            flush.set(Timestamp(micros=after - 1), dynamic_timer_tag=str(after))
            return
        due, pending = [], []
        for entry in buffer.read():
            (due if entry[0] <= now else pending).append(entry)
        if not due:
            return
        version, start_frontier = pinned.read()
        table = Supertable.open(self._s.uri, storage_options=self._s.storage_options)
        latest: Dict[Any, tuple] = {}
        for entry in sorted(due, key=lambda e: e[0]):   # stable: arrival order within a time
            latest[entry[2]] = entry
        rows = [e[3] for e in latest.values() if e[1] == PUT]
        entries, stamp = table.write_superfiles(rows) if rows else ([], {})
        keys = _key_table(list(latest), table.user_schema, table.primary_key)
        # Late commands (a slot below what this job already committed) keep
        # the job's frontier; another writer's higher frontier is not taken
        # over: the commit then fails (FrontierError) instead of landing
        # changes below a frontier that says they are in.
        if own is None:
            own = start_frontier or 0
        frontier = max(now + 1, own)
        result = _commit(self._s, entries=list(entries), keys=keys, frontier=frontier,
                         token=_stream_token(self._s, self._run, now + 1),
                         base_version=version, stamp=stamp.get("grid"),
                         metadata={"run": self._run, "start_version": version})
        front.write(frontier)
        self._fronts[key] = frontier
        buffer.clear()
        for entry in pending:
            buffer.add(entry)
        if result is not None:
            if not result.deduplicated:
                self._commits.inc()
                self._rows.inc(result.rows)
            yield result
