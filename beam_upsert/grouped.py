"""The grouped flavor: one grouping of commands and snapshot, for bounded input."""

from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import KeyState, apply_times, resolve_prior, transition_changes
from beam_upsert.prepare import CMD, INVALID_TAG, PRIOR, decode_key


# Output goes to the global window (the transform re-windows its input there);
# building WindowedValues directly skips a window assignment per change.
GLOBAL_WINDOWS = (GlobalWindow(),)

class GroupedUpsertFn(beam.DoFn):
    """Applies all of one key's commands, grouped, on top of its prior value."""

    def setup(self) -> None:
        self._counters = UpsertCounters()
        # Change times repeat across keys; Timestamp objects are costly to build.
        self._stamps = {}

    def process(self, element):
        key, entries = decode_key(element[0]), element[1]
        commands, priors = [], []
        for entry in entries:
            if entry[0] == CMD:
                commands.append((entry[1], entry[2], entry[3]))
            elif entry[0] == PRIOR:
                priors.append(entry[1])
        if not commands:
            # A snapshot key that no command touches needs no checking: the
            # stateful flavor never looks at it either.
            return
        prior, conflicts = resolve_prior(key, priors)
        for invalid in conflicts:
            yield pvalue.TaggedOutput(INVALID_TAG, invalid)
        _, steps, _, _ = apply_times(KeyState(prior), commands)
        counters = self._counters
        stamps = self._stamps
        for at, old, new in steps:
            counters.count_step(old, new)
            ts = stamps.get(at)
            if ts is None:
                if len(stamps) > 4096:
                    stamps.clear()
                ts = stamps[at] = Timestamp(micros=at)
            for change in transition_changes(key, old, new):
                yield WindowedValue(change, ts, GLOBAL_WINDOWS)
