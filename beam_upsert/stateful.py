"""The stateful flavor: keyed state, a stash, and per-time watermark timers.

Each distinct command time of a key gets its own event-time timer (a dynamic
timer tag), so a time is applied as soon as the watermark passes it and only
then. Process calls only append to the stash and set a timer; state is read
and rewritten once per key per firing (DirectRunner charges about a
millisecond per keyed-state commit, so per-element reads would dominate).

What a key keeps between firings is its live value (one ``STATE`` entry, or
the snapshot's ``PRIOR`` entry until the first firing) plus its pending
commands, nothing else: a key without a value keeps no entry at all, so
deleted keys cost no state (see :mod:`beam_upsert.model` for what that means
for late commands).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.emit import ChangeEmitter
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, KeyState, UpsertCommand, apply_times, resolve_prior
from beam_upsert.prepare import CMD, INVALID_TAG, PRIOR, STATE, decode_key

COUNTS_TAG = "counts"


class StatefulUpsertFn(beam.DoFn):
    """Applies commands per key when the watermark passes their time."""

    STASH = BagStateSpec("stash", coders.FastPrimitivesCoder())
    APPLY = TimerSpec("apply", TimeDomain.WATERMARK)

    def setup(self) -> None:
        self._emitter = ChangeEmitter()

    def process(
        self,
        element,
        stash=beam.DoFn.StateParam(STASH),
        apply=beam.DoFn.TimerParam(APPLY),
    ):
        entry = element[1]
        stash.add(entry)
        if entry[0] == CMD:
            micros = entry[1]
            apply.set(Timestamp(micros=micros), dynamic_timer_tag=str(micros))

    @on_timer(APPLY)
    def apply_due(
        self,
        key=beam.DoFn.KeyParam,
        fired_at=beam.DoFn.TimestampParam,
        stash=beam.DoFn.StateParam(STASH),
    ):
        key = decode_key(key)
        now = fired_at.micros
        state = None
        priors, due, pending = [], [], []
        for entry in stash.read():
            kind = entry[0]
            if kind == CMD:
                (due if entry[1] <= now else pending).append(entry)
            elif kind == STATE:
                state = KeyState(*entry[1:])
            elif kind == PRIOR:
                priors.append(entry[1])
        if not due:
            return  # an earlier firing of this key already applied these times
        read = len(due) + len(pending) + len(priors) + (state is not None)
        if state is None:
            prior, conflicts = resolve_prior(key, priors)
            for invalid in conflicts:
                yield pvalue.TaggedOutput(INVALID_TAG, invalid)
            state = KeyState(prior)
        applied = apply_times(
            state, ((e[1], e[2], e[3]) for e in due), key=key, late_ok=True)
        stash.clear()
        state = applied.state
        kept = len(pending)
        if state.value is not None:
            stash.add((STATE,) + tuple(state))
            kept += 1
        for entry in pending:
            stash.add(entry)
        for _, offset, value, reason in applied.invalid:
            yield pvalue.TaggedOutput(
                INVALID_TAG, Invalid(UpsertCommand(key, value, offset), reason))
        tally = [0, 0, 0]
        yield from self._emitter.emit(key, applied.steps, tally)
        # Counters bumped inside timer callbacks are lost by the streaming
        # DirectRunner, so a firing reports its counts as one element:
        # (inserts, updates, deletes, late, stale, entries read, entries kept).
        yield pvalue.TaggedOutput(
            COUNTS_TAG, (*tally, applied.late_applied, applied.stale_dropped, read, kept))


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
