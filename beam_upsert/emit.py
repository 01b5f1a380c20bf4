"""Turning applied steps into timestamped changes: shared by both flavors."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Tuple

from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_upsert.model import transition_changes

# Output stays in the global window: both flavors emit from a DoFn (or a
# timer) whose input the transform re-windowed there. Changes leave as
# WindowedValues in that window: a TimestampedValue would make Beam call the
# window function's assign for every change, which builds a new GlobalWindow
# and its end timestamp each time (a sixth of the grouped flavor's time).
GLOBAL_WINDOWS = (GlobalWindow(),)
STAMP_CACHE_SIZE = 4096
INSERT, UPDATE, DELETE = 0, 1, 2


def step_kind(old: Any, new: Any) -> int:
    """INSERT, UPDATE or DELETE: what one applied step did to its key."""
    if old is None:
        return INSERT
    return DELETE if new is None else UPDATE


class ChangeEmitter:
    """Emits the changes of applied steps and tallies the steps by kind."""

    def __init__(self) -> None:
        # Change times repeat across keys; Timestamp objects are costly to build.
        self._stamps: dict = {}

    def _timestamp(self, micros: int) -> Timestamp:
        ts = self._stamps.get(micros)
        if ts is None:
            if len(self._stamps) >= STAMP_CACHE_SIZE:
                self._stamps.clear()
            ts = self._stamps[micros] = Timestamp(micros=micros)
        return ts

    def emit(self, key: Any, steps: Iterable[Tuple[int, Any, Any]],
             tally: List[int]) -> Iterator[WindowedValue]:
        """Yields each step's changes at its time; adds 1 to ``tally[step_kind]``."""
        for at, old, new in steps:
            tally[step_kind(old, new)] += 1
            ts = self._timestamp(at)
            for change in transition_changes(key, old, new):
                yield WindowedValue(change, ts, GLOBAL_WINDOWS)
