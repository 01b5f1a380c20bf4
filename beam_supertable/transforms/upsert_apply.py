"""``UpsertToSupertable``'s apply step: each key's commands on top of its prior
(grouped by key shard for bounded input, keyed state and timers for unbounded)."""

from __future__ import annotations

import zlib
from typing import Any, Dict, List

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer)
from apache_beam.utils.timestamp import Timestamp

from beam_supertable.transforms.upsert_table import (
    _STAMP_BLOCK, _STAMP_CMD, _TIMES_TAG, DEL, GROUP_SHARDS, INVALID_TAG, LOOKUP_BATCH_KEYS, PUT,
    SHARD_PART_COMMANDS, _Handles, _key_of, _key_table, _pinned, _Settings, _stream_pin)
from beam_upsert.emit import step_kind
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, KeyState, UpsertCommand, apply_times, too_late_reason
from beam_upsert.prepare import decode_key
from beam_upsert.stateful import (
    bury, check_layout, decode_entry, encode_entry, expire_tombstones, tombstone_expiry)


class _ByShard(beam.DoFn):
    """Grouped flavor: a bundle's commands -> ``(shard, [(key, time µs, offset, row)])``.

    Keys go to ``GROUP_SHARDS`` shards by a hash of their encoded bytes, so
    the shuffle moves one list per shard and bundle instead of one element
    per command (a runner's shuffle costs per element: on Flink every
    element crosses between the runner and the SDK worker and is sorted);
    ``_ApplyGrouped`` groups each shard's commands by key.
    """

    def start_bundle(self):
        self._parts: Dict[int, list] = {}

    def process(self, element):
        key, (micros, offset, row) = element
        shard = zlib.crc32(key) % GROUP_SHARDS
        part = self._parts.setdefault(shard, [])
        part.append((key, micros, offset, row))
        if len(part) >= SHARD_PART_COMMANDS:
            yield shard, self._parts.pop(shard)

    def finish_bundle(self):
        parts, self._parts = self._parts, {}
        for shard, part in parts.items():
            yield window.GlobalWindows.windowed_value((shard, part))


class _ApplyGrouped(beam.DoFn):
    """Grouped flavor: ``(shard, parts)`` -> ``(PUT, key, row)`` / ``(DEL, key, None)``.

    Commands below the pinned frontier are dropped and counted; the
    greatest time of the others goes to ``times``. Keys are gathered
    ``LOOKUP_BATCH_KEYS`` at a time so their prior rows are read back from
    the pinned version in one lookup.
    """

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._counters = UpsertCounters()
        self._handles = _Handles(self._s)

    def start_bundle(self):
        self._pending: List[tuple] = []
        self._version = None

    def process(self, element, pin=None):
        self._version = pin["version"]
        frontier = pin["frontier"]
        by_key: Dict[bytes, list] = {}
        greatest, dropped = None, 0
        for part in element[1]:
            for key, micros, offset, row in part:
                if frontier is not None and micros < frontier:
                    dropped += 1
                    continue
                by_key.setdefault(key, []).append((micros, offset, row))
                greatest = micros if greatest is None or micros > greatest else greatest
        if dropped:
            self._counters.dropped_before_resume.inc(dropped)
        if greatest is not None:
            yield pvalue.TaggedOutput(_TIMES_TAG, greatest)
        for key, commands in by_key.items():
            self._pending.append((decode_key(key), commands))
            if len(self._pending) >= LOOKUP_BATCH_KEYS:
                yield from self._flush()

    def finish_bundle(self):
        if self._pending:
            yield from self._flush()

    def _flush(self):
        pending, self._pending = self._pending, []
        lookup = self._handles.lookup(self._version)
        table = lookup.table
        names = table.primary_key
        keys = [k for k, _ in pending]
        found = lookup.rows(_key_table(keys, table.user_schema, names),
                            table.user_schema.names).to_pylist()
        priors = {_key_of(r, names): r for r in found}
        tally = [0, 0, 0]
        for key, commands in pending:
            applied = apply_times(KeyState(priors.get(key)), commands, key=key)
            for _, offset, value, reason in applied.invalid:
                self._counters.invalid.inc()
                yield pvalue.TaggedOutput(INVALID_TAG, window.GlobalWindows.windowed_value(
                    Invalid(UpsertCommand(key, value, offset), reason)))
            if not applied.steps:
                continue
            for _, old, new in applied.steps:
                tally[step_kind(old, new)] += 1
            value = applied.state.value
            yield window.GlobalWindows.windowed_value(
                (PUT, key, value) if value is not None else (DEL, key, None))
        self._counters.add_steps(tally)


class _ApplyStateful(beam.DoFn):
    """Stateful flavor: applies each key's commands when the watermark passes their time.

    Input: ``(shard, (encoded key, (time µs, offset, row | None)))`` from
    :class:`beam_upsert.stateful.ShardKeys`. State and timers live per
    state shard, not per key (``beam_upsert.stateful``'s design: a runner's
    fixed cost is per stateful key, so this pays it per shard): process calls
    append to the shard's stash and set one timer per (shard, time); a
    firing at ``t`` reads the stash once, applies every key's commands at or
    before ``t``, and rewrites the stash as one block
    ``(BLOCK, values {key: KeyState}, pending {time: [[(offset, row, key)]]},
    expiries {time: [[key]]}, forget frontier)`` (``beam_upsert.stateful``'s
    block, without snapshot priors).

    A shard pins the table version it reads priors from, and the frontier
    below which commands are dropped, on its first command
    (:func:`_stream_pin`). A key's prior is read back from the pinned
    version on its first firing (all of a firing's new keys in one lookup).
    After that the shard holds the key's state: its value for as long as it
    has one, and, once deleted, a tombstone (its last time and offset) for
    ``tombstone_retention`` of event time, so a late command for it follows
    the offset rule as in ``beam_upsert``'s stateful flavor.

    A dropped tombstone's key is read back from the pinned version again if
    a command names it later, and that version may predate our own delete of
    it: the key may read back as holding a row it no longer holds. That
    stale prior can only matter when the key ends holding the very row it
    read: no step, so nothing would be written. So once a shard has dropped a
    tombstone, a key read back from the table that ends holding the row it
    read is written again (an idempotent replace); every other outcome
    writes the key's final state anyway (a PUT or DEL resolves the key
    against the version the commit lands on). Commands for such keys at or
    below the shard's forget frontier (the newest time of a tombstone it
    dropped) are refused as too late and never read the table.
    ``tombstone_retention=0`` keeps, as before, every touched key's state
    for ever (without tombstone offsets: a late command for a deleted key is
    applied at its own time).
    """

    STASH = BagStateSpec("stash", coders.BytesCoder())
    PIN = ReadModifyWriteStateSpec("pin", coders.FastPrimitivesCoder())
    APPLY = TimerSpec("apply", TimeDomain.WATERMARK)

    def __init__(self, settings: _Settings, run: str, tombstone_retention_micros: int) -> None:
        self._s = settings
        self._run = run
        self._retention = tombstone_retention_micros

    def setup(self):
        self._counters = UpsertCounters()
        self._handles = _Handles(self._s)

    def start_bundle(self):
        # Per bundle: (shard, time) timers already set (setting one again
        # changes nothing, and each set is a message to the runner) and the
        # pins read (a pin never changes once written).
        self._set = set()
        self._pins: Dict[int, tuple] = {}

    def _pin(self, shard, pinned) -> tuple:
        pin = self._pins.get(shard)
        if pin is None:
            pin = pinned.read()
            if pin is None:
                pin = tuple(_stream_pin(self._s, self._run))
                pinned.write(pin)
            self._pins[shard] = pin
        return pin

    def process(self, element, stash=beam.DoFn.StateParam(STASH),
                pinned=beam.DoFn.StateParam(PIN), apply=beam.DoFn.TimerParam(APPLY)):
        shard, (key, (micros, offset, row)) = element
        frontier = self._pin(shard, pinned)[1]
        if frontier is not None and micros < frontier:
            self._counters.dropped_before_resume.inc()
            return
        stash.add(encode_entry((_STAMP_CMD, micros, offset, row, key)))
        tag = (shard, micros)
        if tag not in self._set:
            self._set.add(tag)
            apply.set(Timestamp(micros=micros), dynamic_timer_tag=str(micros))

    @on_timer(APPLY)
    def apply_due(self, shard=beam.DoFn.KeyParam, tag=beam.DoFn.DynamicTimerTagParam,
                  stash=beam.DoFn.StateParam(STASH), pinned=beam.DoFn.StateParam(PIN),
                  apply=beam.DoFn.TimerParam(APPLY)):
        # The time comes from the tag, not the firing's timestamp: Flink keeps
        # timers in milliseconds, so a command at 1.0005 s would fire at
        # 1.000 s and never be due.
        now = int(tag)
        # A timer set again after this firing in the same bundle must be set anew.
        self._set.discard((shard, now))
        values, pending, due, fresh, expiries, forgotten = {}, {}, {}, {}, {}, None
        for raw in stash.read():
            entry = decode_entry(raw)
            if entry[0] == _STAMP_CMD:
                _, time, offset, row, key = entry
                if time <= now:
                    due.setdefault(key, []).append((time, offset, row))
                else:
                    fresh.setdefault(time, []).append((offset, row, key))
            elif entry[0] == _STAMP_BLOCK:
                _, values, pending, expiries, forgotten = entry
            else:
                check_layout(entry)
        due_times = [time for time in pending if time <= now]
        if not due and not due_times and not any(at <= now for at in expiries):
            return  # an earlier firing of this shard already applied these times
        for time in due_times:
            for chunk in pending.pop(time):
                for offset, row, key in decode_entry(chunk):
                    due.setdefault(key, []).append((time, offset, row))
        priors = self._priors([k for k in due if k not in values], self._pin(shard, pinned))
        retention = self._retention
        buried: Dict[int, list] = {}   # expiry time -> keys that are tombstones now
        due_already = None             # tombstones due when made: dropped after the loop
        tally = [0, 0, 0]
        for encoded, commands in due.items():
            key = decode_key(encoded)
            held = values.get(encoded)
            read_back = held is None
            state = KeyState(*decode_entry(held)) if held is not None \
                else KeyState(priors.get(key))
            refused = []
            if read_back and forgotten is not None:
                # The row read back may be one this job deleted and forgot:
                # its commands at or below the forget frontier are too late
                # whatever the table holds.
                refused = [c for c in commands if c[0] <= forgotten]
                if refused:
                    commands = [c for c in commands if c[0] > forgotten]
            applied = apply_times(state, commands, key=key, late_ok=True,
                                  tombstones=retention > 0, forgotten_through=forgotten)
            state = applied.state
            if read_back and retention > 0 and state.applied_through is None:
                pass    # nothing applied: the key stays unknown to the shard
            elif retention == 0 or state.value is not None:
                values[encoded] = encode_entry(tuple(state))
            elif state.applied_through is not None:
                expiry = tombstone_expiry(state.applied_through, retention)
                if expiry > now:
                    values[encoded] = encode_entry(tuple(state))
                    if held is None or tuple(state) != decode_entry(held):
                        buried.setdefault(expiry, []).append(encoded)
                else:
                    values.pop(encoded, None)
                    if due_already is None or state.applied_through > due_already:
                        due_already = state.applied_through
            for time, offset, value in refused + list(applied.too_late):
                self._counters.too_late.inc()
                self._counters.invalid.inc()
                yield pvalue.TaggedOutput(INVALID_TAG, Invalid(
                    UpsertCommand(key, value, offset),
                    too_late_reason(key, time, forgotten, retention)))
            for _, offset, value, reason in applied.invalid:
                self._counters.invalid.inc()
                yield pvalue.TaggedOutput(INVALID_TAG, Invalid(UpsertCommand(key, value, offset),
                                                               reason))
            value = state.value
            if not applied.steps:
                if read_back and forgotten is not None and value is not None \
                        and state.applied_through is not None:
                    # The row read back may be one our own commits deleted.
                    yield window.TimestampedValue(
                        (PUT, key, value), Timestamp(micros=state.applied_through))
                continue
            for _, old, new in applied.steps:
                tally[step_kind(old, new)] += 1
            yield window.TimestampedValue(
                (PUT, key, value) if value is not None else (DEL, key, None),
                Timestamp(micros=applied.steps[-1][0]))
        self._counters.add_steps(tally)
        for time, commands in fresh.items():
            pending.setdefault(time, []).append(encode_entry(commands))
        if due_already is not None and (forgotten is None or due_already > forgotten):
            forgotten = due_already
        if expiries:
            forgotten = expire_tombstones(values, expiries, forgotten, now, retention)
        bury(buried, expiries, shard, self._set, apply)
        stash.clear()
        stash.add(encode_entry((_STAMP_BLOCK, values, pending, expiries, forgotten)))

    def _priors(self, encoded: List[bytes], pin: tuple) -> Dict[Any, dict]:
        """The live rows of keys first touched here, read back from the pinned version."""
        if not encoded:
            return {}
        lookup = self._handles.lookup(pin[0])
        table = lookup.table
        names = table.primary_key
        out: Dict[Any, dict] = {}
        keys = [decode_key(k) for k in encoded]
        for i in range(0, len(keys), LOOKUP_BATCH_KEYS):
            found = lookup.rows(_key_table(keys[i:i + LOOKUP_BATCH_KEYS], table.user_schema,
                                           names), table.user_schema.names).to_pylist()
            out.update((_key_of(r, names), r) for r in found)
        return out


class _TimesAbove(beam.DoFn):
    """Bounded stateful flavor: the times of commands at or above the pinned frontier."""

    def process(self, element, pin=None):
        micros = element[1][0]
        if pin["frontier"] is None or micros >= pin["frontier"]:
            yield micros


class _LatestPerKey(beam.DoFn):
    """Bounded input through the stateful flavor: each key's last change only."""

    def process(self, element):
        key, changes = element
        yield max(changes, key=lambda c: c[0])[1]


# -- the commit's inputs (bounded) ---------------------------------------------------------


class _KeysToArrow(beam.DoFn):
    """Changed keys -> Arrow tables of the key columns (what the commit resolves)."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def process(self, keys, pin=None):
        table = _pinned(self._s, pin["version"])
        yield _key_table(keys, table.user_schema, table.primary_key)
