"""The grouped flavor: one grouping of commands and snapshot, for bounded input."""

from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

from beam_upsert.emit import ChangeEmitter
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, KeyState, UpsertCommand, apply_times, resolve_prior
from beam_upsert.prepare import CMD, INVALID_TAG, PRIOR, decode_key


class GroupedUpsertFn(beam.DoFn):
    """Applies all of one key's commands, grouped, on top of its prior value."""

    def setup(self) -> None:
        self._counters = UpsertCounters()
        self._emitter = ChangeEmitter()

    def process(self, element):
        # Outputs go back as one list (see ChangeEmitter.emit).
        key, entries = decode_key(element[0]), element[1]
        commands, priors = [], []
        for entry in entries:
            if entry[0] == CMD:
                commands.append(entry[1:])          # (time_micros, offset, value)
            elif entry[0] == PRIOR:
                priors.append(entry[1])
        if not commands:
            # A snapshot key that no command touches needs no checking: the
            # stateful flavor never looks at it either.
            return ()
        prior, conflicts = resolve_prior(key, priors)
        out = [pvalue.TaggedOutput(INVALID_TAG, invalid) for invalid in conflicts]
        applied = apply_times(KeyState(prior), commands, key=key)
        for _, offset, value, reason in applied.invalid:
            out.append(pvalue.TaggedOutput(
                INVALID_TAG, Invalid(UpsertCommand(key, value, offset), reason)))
        tally = [0, 0, 0]
        self._emitter.emit(key, applied.steps, tally, out)
        self._counters.add_steps(tally)
        return out
