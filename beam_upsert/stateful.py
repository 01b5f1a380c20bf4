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
nothing else: a key without a value keeps no entry at all, so deleted keys
cost no state (see :mod:`beam_upsert.model` for what that means for late
commands). Process calls only append to the stash and set a timer; a firing
reads the stash once and rewrites it as one block.
"""

from __future__ import annotations

import zlib

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.emit import ChangeEmitter
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, KeyState, UpsertCommand, apply_times, resolve_prior
from beam_upsert.prepare import CMD, INVALID_TAG, PRIOR, decode_key

COUNTS_TAG = "counts"
# A firing rewrites its shard's stash as one entry:
#   (BLOCK, values {key: enc (value, through, max_offset)},
#    priors {key: enc [snapshot values]}, pending {time: [enc [(offset, value,
#    key)], ...]}, counts {time: pending commands})
# with keys as their encoded bytes (equal keys of different types, 1 and 1.0,
# must stay apart, as they do when they are state keys of their own). Its
# parts stay encoded ("enc"), so a firing decodes only the keys and times it
# applies, not the whole shard.
BLOCK = "b"
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
    ):
        now = fired_at.micros
        # A timer set again after this firing in the same bundle must be set anew.
        self._set.discard((shard, now))
        values, priors, pending, counts = {}, {}, {}, {}
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
            else:
                _, values, priors, pending, counts = entry
        due_times = [time for time in pending if time <= now]
        if not due and not due_times:
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
        late = stale = 0
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
            applied = apply_times(state, commands, key=key, late_ok=True)
            state = applied.state
            if state.value is not None:
                values[encoded] = _encode(tuple(state))
            late += applied.late_applied
            stale += applied.stale_dropped
            for _, offset, value, reason in applied.invalid:
                yield pvalue.TaggedOutput(
                    INVALID_TAG, Invalid(UpsertCommand(key, value, offset), reason))
            yield from self._emitter.emit(key, applied.steps, tally)
        for key, found in fresh_priors.items():
            priors[key] = _encode(found)
        for time, commands in fresh.items():
            pending.setdefault(time, []).append(_encode(commands))
            counts[time] = counts.get(time, 0) + len(commands)
        stash.clear()
        kept = len(values) + len(priors) + sum(counts.values())
        if kept:
            stash.add(_encode((BLOCK, values, priors, pending, counts)))
        # Counters bumped inside timer callbacks are lost by the streaming
        # DirectRunner, so a firing reports its counts as one element:
        # (inserts, updates, deletes, late, stale, entries the shard held,
        # entries it keeps).
        yield pvalue.TaggedOutput(COUNTS_TAG, (*tally, late, stale, held, kept))


class ReportCounts(beam.DoFn):
    """Adds the counts reported by :class:`StatefulUpsertFn` firings."""

    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, counts):
        c = self._counters
        c.add_steps(counts[:3])
        late, stale, _, kept = counts[3:]
        if late:
            c.late_applied.inc(late)
        if stale:
            c.stale_dropped.inc(stale)
        c.state_entries.update(kept)
