"""The stateful flavor: keyed state, a stash, and watermark timers, per shard.

Keys are hashed onto a fixed number of *state shards*, and the state and
timers live per shard, not per key: each shard holds one stash whose entries
name their key. A runner's fixed cost is per stateful key, not per element:
on Flink's portable runner every key is its own bundle in batch mode (two SDK
round trips, about 2-3 ms) and its own state requests in streaming mode, so a
per-key design pays that for each of 50,000 keys, and the DirectRunner charges
about a millisecond per key's state commit. Sharding pays it per shard.

Each distinct command time of a shard gets its own event-time timer (a
dynamic timer tag), so a time is applied as soon as the watermark passes it
and only then, exactly as a per-key timer would: a firing at ``t`` applies,
for every key of the shard with commands at or before ``t`` still pending,
those commands (keys with none are left untouched), so each key sees the
same sequence of applications as it would with timers of its own (a key's
extra firings, at other keys' times, find nothing due for it and change
nothing).

What a shard keeps between firings is, per key, its live value (or the
snapshot's value until the key's first firing) plus its pending commands,
and, for a deleted key, a *tombstone*: its last applied time and offset, so
that a late command for it follows the offset rule (see
:mod:`beam_upsert.model`). A tombstone is kept for ``tombstone_retention``
of event time after its time, then dropped by a firing of the shard's timer
at its expiry (expiries are rounded up to slots of a sixtieth of the
retention, at least a second, so a shard sets about 60 expiry timers per
retention at most, and a tombstone lives at most 1/60 longer). The shard then
remembers one number, its *forget frontier* (the newest time of a tombstone
it dropped): a command for a key holding neither value nor tombstone at or
below it is too late and refused. ``tombstone_retention=0`` keeps no
tombstones (a deleted key keeps nothing, a late command for it is fresh).
Process calls only append to the stash and set a timer; a firing reads the
stash once and rewrites it as one block.
"""

from __future__ import annotations

import zlib

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.emit import ChangeEmitter
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import (
    Invalid, KeyState, UpsertCommand, apply_times, resolve_prior, too_late_reason)
from beam_upsert.prepare import CMD, INVALID_TAG, PRIOR, decode_key

COUNTS_TAG = "counts"
# A firing rewrites its shard's stash as one entry:
#   (BLOCK, values {key: enc (value, through, max_offset)},
#    priors {key: enc [snapshot values]}, pending {time: [enc [(offset, value,
#    key)], ...]}, counts {time: pending commands},
#    expiries {expiry time: [enc [key, ...], ...]}, forget frontier | None)
# with keys as their encoded bytes (equal keys of different types, 1 and 1.0,
# must stay apart, as they do when they are state keys of their own). Its
# parts stay encoded ("enc"), so a firing decodes only the keys and times it
# applies, not the whole shard. A value of None with a time and offset is a
# tombstone; ``expiries`` lists the keys that became tombstones, by when
# they expire (a listed key may have been written again since: an expiry
# drops it only if it is still a tombstone that is due).
BLOCK = "B"
# Stash entries are stored encoded: the SDK's state cache measures the size
# of what it holds by walking every object, which for a decoded shard block
# (thousands of tuples) cost more than the upsert itself; a bytes entry is
# one object.
_ENTRY_CODER = coders.FastPrimitivesCoder()
_encode, _decode = _ENTRY_CODER.encode, _ENTRY_CODER.decode
# The same, for other per-shard stateful DoFns (beam_supertable's
# UpsertToSupertable keeps its shard stashes this way too).
encode_entry, decode_entry = _encode, _decode
# Enough shards to spread over the parallelism of a large job, few enough
# that per-shard costs (a bundle, a state round trip) stay small.
DEFAULT_STATE_SHARDS = 64
# A deleted key's tombstone is kept for an hour of event time by default:
# long enough for the lateness streaming sources usually allow (and the
# order of Beam's usual allowed lateness), and it costs a few dozen bytes per
# deleted key (docs/benchmarks.md).
DEFAULT_TOMBSTONE_RETENTION_US = 3600 * 1_000_000
# Expiries are rounded up to slots of a sixtieth of the retention, whole
# seconds and at least one: a shard sets at most about 60 expiry timers per
# retention (each firing reads and rewrites the shard's block), a tombstone
# lives at most 1/60 longer than the retention, and the times are whole
# milliseconds for Flink's timers.
TOMBSTONE_EXPIRY_SLOTS = 60
TOMBSTONE_EXPIRY_SLOT_MIN_US = 1_000_000


# The latest time a timer may be set for: the end of the global window (the
# one stateful upserts run in). A tombstone due later expires there.
LAST_TIMER_US = GlobalWindow().max_timestamp().micros


def tombstone_expiry(through: int, retention_micros: int) -> int:
    """When a tombstone of time ``through`` may be dropped (micros, rounded up to a
    slot, and never past the end of the global window, where timers end)."""
    second = TOMBSTONE_EXPIRY_SLOT_MIN_US
    slot = max(second, retention_micros // TOMBSTONE_EXPIRY_SLOTS // second * second)
    end = through + retention_micros
    return min(-(-end // slot) * slot, LAST_TIMER_US)


def check_layout(entry) -> None:
    """Refuses a stash entry of an earlier state layout with what to do about it."""
    raise ValueError(
        f"stateful upsert state has an entry of kind {entry[0]!r}, written by an earlier "
        "state layout (before tombstones); restart the job from the table or the "
        "snapshot (prior=..., resume_at=...) instead of from its old state")


def expire_tombstones(values: dict, expiries: dict, forgotten, now: int,
                      retention_micros: int):
    """Drops the tombstones due at ``now``; returns the new forget frontier.

    Args:
        values: ``{encoded key: encoded (value, through, max_offset)}``, changed in place.
        expiries: ``{expiry time: [encoded [encoded key, ...]]}``, changed in place.
        forgotten: the shard's forget frontier so far, or None.
        now: the firing's time (micros).
        retention_micros: the tombstone retention.
    """
    for at in [at for at in expiries if at <= now]:
        for chunk in expiries.pop(at):
            for encoded in _decode(chunk):
                stored = values.get(encoded)
                if stored is None:
                    continue
                value, through = _decode(stored)[:2]
                if value is None and through is not None \
                        and tombstone_expiry(through, retention_micros) <= now:
                    del values[encoded]
                    if forgotten is None or through > forgotten:
                        forgotten = through
    return forgotten


def bury(buried: dict, expiries: dict, shard, set_already: set, timer) -> None:
    """Indexes a firing's new tombstones by expiry and sets each expiry's timer once.

    Args:
        buried: ``{expiry time: [encoded key, ...]}`` of this firing.
        expiries: the shard's expiry index, changed in place.
        set_already: ``(shard, time)`` timers this bundle set (changed in place).
        timer: the shard's watermark timer (dynamic tags).
    """
    for expiry, keys in buried.items():
        expiries.setdefault(expiry, []).append(_encode(keys))
        if (shard, expiry) not in set_already:
            set_already.add((shard, expiry))
            timer.set(Timestamp(micros=expiry), dynamic_timer_tag=str(expiry))


def shard_of(encoded_key: bytes, shards: int) -> int:
    """The state shard of an encoded key: stable across processes and runs."""
    return zlib.crc32(encoded_key) % shards


class ShardKeys(beam.DoFn):
    """``(key, entry)`` -> ``(shard, (key, entry))`` for :class:`StatefulUpsertFn`."""

    def __init__(self, shards: int = DEFAULT_STATE_SHARDS) -> None:
        if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
            raise ValueError(f"state shards must be a positive int, got {shards!r}")
        self._shards = shards

    def process(self, element):
        yield shard_of(element[0], self._shards), element


class StatefulUpsertFn(beam.DoFn):
    """Applies commands per key, per shard, when the watermark passes their time.

    Input: ``(shard, (encoded_key, entry))`` from :class:`ShardKeys`.
    """

    STASH = BagStateSpec("stash", coders.BytesCoder())
    APPLY = TimerSpec("apply", TimeDomain.WATERMARK)

    def __init__(self, tombstone_retention_micros: int = DEFAULT_TOMBSTONE_RETENTION_US) -> None:
        self._retention = tombstone_retention_micros

    def setup(self) -> None:
        self._emitter = ChangeEmitter()

    def start_bundle(self) -> None:
        # (shard, time) timers already set in this bundle: setting one again
        # changes nothing, and each set is a message to the runner.
        self._set = set()

    def process(
        self,
        element,
        stash=beam.DoFn.StateParam(STASH),
        apply=beam.DoFn.TimerParam(APPLY),
    ):
        shard, (key, entry) = element
        if entry[0] == CMD:
            micros = entry[1]
            stash.add(_encode((CMD, micros, entry[2], entry[3], key)))
            tag = (shard, micros)
            if tag not in self._set:
                self._set.add(tag)
                apply.set(Timestamp(micros=micros), dynamic_timer_tag=str(micros))
        else:
            stash.add(_encode((PRIOR, entry[1], key)))

    @on_timer(APPLY)
    def apply_due(
        self,
        shard=beam.DoFn.KeyParam,
        fired_at=beam.DoFn.TimestampParam,
        stash=beam.DoFn.StateParam(STASH),
        apply=beam.DoFn.TimerParam(APPLY),
    ):
        now = fired_at.micros
        # A timer set again after this firing in the same bundle must be set anew.
        self._set.discard((shard, now))
        values, priors, pending, counts, expiries, forgotten = {}, {}, {}, {}, {}, None
        due, fresh, fresh_priors = {}, {}, {}
        for raw in stash.read():
            entry = _decode(raw)
            kind = entry[0]
            if kind == CMD:
                time = entry[1]
                if time <= now:
                    due.setdefault(entry[4], []).append((time, entry[2], entry[3]))
                else:
                    fresh.setdefault(time, []).append((entry[2], entry[3], entry[4]))
            elif kind == PRIOR:
                fresh_priors.setdefault(entry[2], []).append(entry[1])
            elif kind == BLOCK:
                _, values, priors, pending, counts, expiries, forgotten = entry
            else:
                check_layout(entry)
        due_times = [time for time in pending if time <= now]
        if not due and not due_times and not any(at <= now for at in expiries):
            return  # an earlier firing of this shard already applied these times
        held = (len(values) + len(priors) + sum(counts.values())
                + sum(map(len, due.values())) + sum(map(len, fresh.values()))
                + sum(map(len, fresh_priors.values())))
        for time in due_times:
            del counts[time]
            for chunk in pending.pop(time):
                for offset, value, key in _decode(chunk):
                    due.setdefault(key, []).append((time, offset, value))
        for key, found in fresh_priors.items():
            if key in due or key not in priors:
                continue
            # A key the snapshot named before and names again, untouched so far.
            fresh_priors[key] = _decode(priors.pop(key)) + found
        tally = [0, 0, 0]
        late = stale = too_late = 0
        retention = self._retention
        buried: dict = {}   # expiry time -> keys that are tombstones after this firing
        # Tombstones already due when made (a very late delete) are dropped
        # after the loop: every key of a firing sees the same forget frontier.
        due_already = None
        for encoded, commands in due.items():
            key = decode_key(encoded)
            stored = values.pop(encoded, None)
            found = fresh_priors.pop(encoded, [])
            if encoded in priors:
                found = _decode(priors.pop(encoded)) + found
            if stored is None:
                prior, conflicts = resolve_prior(key, found)
                for invalid in conflicts:
                    yield pvalue.TaggedOutput(INVALID_TAG, invalid)
                state = KeyState(prior)
            else:
                state = KeyState(*_decode(stored))
            was = state
            applied = apply_times(state, commands, key=key, late_ok=True,
                                  tombstones=retention > 0, forgotten_through=forgotten)
            state = applied.state
            if state.value is not None:
                values[encoded] = _encode(tuple(state))
            elif state.applied_through is not None:
                expiry = tombstone_expiry(state.applied_through, retention)
                if expiry > now:
                    values[encoded] = _encode(tuple(state))
                    if state != was:   # a tombstone already indexed stays indexed
                        buried.setdefault(expiry, []).append(encoded)
                elif due_already is None or state.applied_through > due_already:
                    due_already = state.applied_through
            late += applied.late_applied
            stale += applied.stale_dropped
            for time, offset, value in applied.too_late:
                too_late += 1
                yield pvalue.TaggedOutput(INVALID_TAG, Invalid(
                    UpsertCommand(key, value, offset),
                    too_late_reason(key, time, forgotten, retention)))
            for _, offset, value, reason in applied.invalid:
                yield pvalue.TaggedOutput(
                    INVALID_TAG, Invalid(UpsertCommand(key, value, offset), reason))
            yield from self._emitter.emit(key, applied.steps, tally)
        for key, found in fresh_priors.items():
            priors[key] = _encode(found)
        for time, commands in fresh.items():
            pending.setdefault(time, []).append(_encode(commands))
            counts[time] = counts.get(time, 0) + len(commands)
        if due_already is not None and (forgotten is None or due_already > forgotten):
            forgotten = due_already
        if expiries:
            forgotten = expire_tombstones(values, expiries, forgotten, now, retention)
        bury(buried, expiries, shard, self._set, apply)
        stash.clear()
        kept = len(values) + len(priors) + sum(counts.values())
        size = 0
        if kept or forgotten is not None:
            block = _encode((BLOCK, values, priors, pending, counts, expiries, forgotten))
            size = len(block)
            stash.add(block)
        # Counters bumped inside timer callbacks are lost by the streaming
        # DirectRunner, so a firing reports its counts as one element:
        # (inserts, updates, deletes, late, stale, entries the shard held,
        # entries it keeps, too late, bytes it keeps).
        yield pvalue.TaggedOutput(
            COUNTS_TAG, (*tally, late, stale, held, kept, too_late, size))


class ReportCounts(beam.DoFn):
    """Adds the counts reported by :class:`StatefulUpsertFn` firings."""

    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, counts):
        c = self._counters
        c.add_steps(counts[:3])
        late, stale, _, kept, too_late, size = counts[3:]
        if late:
            c.late_applied.inc(late)
        if stale:
            c.stale_dropped.inc(stale)
        if too_late:
            c.too_late.inc(too_late)
        c.state_entries.update(kept)
        c.state_bytes.update(size)
