"""Turning applied steps into timestamped changes: shared by both flavors."""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import windowed_value
from apache_beam.utils.windowed_value import WindowedValue

from beam_upsert.model import transition_changes

# Output stays in the global window: both flavors emit from a DoFn (or a
# timer) whose input the transform re-windowed there. Changes leave as
# WindowedValues in that window: a TimestampedValue would make Beam call the
# window function's assign for every change, which builds a new GlobalWindow
# and its end timestamp each time (a sixth of the grouped flavor's time).
# ``windowed_value.create`` (what Beam's coders build decoded elements with)
# takes the time in micros, so no Timestamp object is built per change; one
# is made on demand if a consumer asks for it.
GLOBAL_WINDOWS = (GlobalWindow(),)
INSERT, UPDATE, DELETE = 0, 1, 2


def step_kind(old: Any, new: Any) -> int:
    """INSERT, UPDATE or DELETE: what one applied step did to its key."""
    if old is None:
        return INSERT
    return DELETE if new is None else UPDATE


class ChangeEmitter:
    """Emits the changes of applied steps and tallies the steps by kind."""

    def emit(self, key: Any, steps: Iterable[Tuple[int, Any, Any]],
             tally: List[int], out: Optional[list] = None) -> List[WindowedValue]:
        """Each step's changes at its time, appended to ``out`` (or a new list),
        and 1 added to ``tally[step_kind]``.

        A list rather than a generator: a DoFn that returns its outputs as a
        list lets Beam iterate them without resuming Python frames per change.
        """
        out = [] if out is None else out
        create, append = windowed_value.create, out.append
        for at, old, new in steps:
            tally[step_kind(old, new)] += 1
            for change in transition_changes(key, old, new):
                append(create(change, at, GLOBAL_WINDOWS))
        return out
