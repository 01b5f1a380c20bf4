"""Commands, changes, and the per-key upsert rule shared by every flavor.

Both Beam flavors and the reference tests call :func:`apply_times`, so they
cannot drift apart: the flavors differ only in how commands reach it.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
from typing import Any, Hashable, Iterable, List, NamedTuple, Optional, Tuple

__all__ = [
    "Change",
    "UpsertCommand",
    "UpsertError",
    "Invalid",
    "KeyState",
    "apply_times",
    "resolve_prior",
    "transition_changes",
    "check_command",
    "check_key",
    "winner",
]


class UpsertCommand(NamedTuple):
    """One upsert: ``key`` now holds ``value`` (``None`` deletes it).

    The element's event timestamp is the command's time; ``offset`` orders
    commands that share a time (the greatest offset wins).
    """

    key: Hashable
    value: Any
    offset: Any


class Change(NamedTuple):
    """One row of the differential changelog: ``diff`` is +1 or -1."""

    key: Hashable
    value: Any
    diff: int


@dataclasses.dataclass(frozen=True)
class UpsertError:
    """A value that failed to decode for its key.

    It is a value, not an exception: a key can hold an error, the error is
    emitted like any other value and retracted once a good value replaces it.
    """

    message: str
    raw: Optional[bytes] = None


class Invalid(NamedTuple):
    """A malformed element together with why it was refused."""

    element: Any
    reason: str


class KeyState(NamedTuple):
    """What a key holds between firings.

    ``applied_through`` is the last time (micros) applied for the key and
    ``max_offset`` the greatest offset applied; both decide the fate of late
    commands in the stateful flavor.
    """

    value: Any = None
    applied_through: Optional[int] = None
    max_offset: Any = None


_KEY_SCALARS = (str, bytes, int, bool)
_OFFSET_SCALARS = (str, bytes, int, decimal.Decimal)


def check_key(key: Any) -> Optional[str]:
    """Returns why ``key`` cannot be a key, or None when it can.

    Keys must encode deterministically (Beam groups by encoded bytes), so
    only strings, bytes, ints, bools, finite floats and tuples of them pass.
    """
    if key is None:
        return "key is None"
    if isinstance(key, _KEY_SCALARS):
        return None
    if isinstance(key, float):
        return None if math.isfinite(key) else f"key {key!r} is not a finite float"
    if isinstance(key, tuple):
        for part in key:
            reason = check_key(part)
            if reason is not None:
                return f"key {key!r}: part {reason}"
        return None
    return (
        f"key of type {type(key).__name__} has no deterministic encoding "
        "(use str, bytes, int, float or a tuple of them)"
    )


def _check_offset(offset: Any) -> Optional[str]:
    if offset is None:
        return "offset is None"
    if isinstance(offset, bool):
        return None
    if isinstance(offset, _OFFSET_SCALARS):
        return None
    if isinstance(offset, float):
        return None if not math.isnan(offset) else "offset is NaN, which is not orderable"
    if isinstance(offset, tuple):
        for part in offset:
            reason = _check_offset(part)
            if reason is not None:
                return f"offset {offset!r}: part {reason}"
        return None
    return f"offset of type {type(offset).__name__} is not orderable"


def check_command(element: Any) -> Tuple[Optional[UpsertCommand], Optional[str]]:
    """Normalizes an input element to an :class:`UpsertCommand`.

    Returns:
        ``(command, None)`` for a good element, ``(None, reason)`` otherwise.
    """
    if not isinstance(element, tuple) or len(element) != 3:
        return None, (
            f"expected UpsertCommand(key, value, offset) or a 3-tuple, got "
            f"{type(element).__name__}"
            + (f" of length {len(element)}" if isinstance(element, tuple) else "")
        )
    key, value, offset = element
    reason = check_key(key)
    if reason is None:
        reason = _check_offset(offset)
    if reason is not None:
        return None, reason
    return UpsertCommand(key, value, offset), None


def _tiebreak(value: Any) -> Tuple[str, str]:
    # Equal offsets inside one time should not happen with a real source; when
    # they do, the pick must still not depend on arrival order.
    return (type(value).__name__, repr(value))


def winner(commands: Iterable[Tuple[Any, Any]]) -> Tuple[Any, Any]:
    """The ``(offset, value)`` with the greatest offset, ties broken stably."""
    return max(commands, key=lambda c: (c[0], _tiebreak(c[1])))


def apply_times(
    state: KeyState,
    commands: Iterable[Tuple[int, Any, Any]],
    *,
    late_ok: bool = False,
) -> Tuple[KeyState, List[Tuple[int, Any, Any]], int, int]:
    """Applies ``(time_micros, offset, value)`` commands to one key.

    Commands are collapsed per time to the greatest offset and applied in
    ascending time order. With ``late_ok`` (the stateful flavor), a time at or
    before ``state.applied_through`` is late: its winner is applied at
    ``applied_through`` if its offset is newer than every offset already
    applied, otherwise it is dropped.

    Returns:
        ``(new_state, transitions, late_applied, stale_dropped)`` where each
        transition ``(time_micros, old, new)`` is one applied step with
        ``old != new``; :func:`transition_changes` turns it into changes.
    """
    by_time: dict = {}
    for time, offset, value in commands:
        by_time.setdefault(time, []).append((offset, value))
    value, through, max_offset = state
    steps: List[Tuple[int, Any, Any]] = []
    late_applied = stale_dropped = 0
    for time in sorted(by_time):
        group = by_time[time]
        offset, new = winner(group)
        at = time
        if late_ok and through is not None and time <= through:
            if max_offset is not None and not offset > max_offset:
                stale_dropped += len(group)
                continue
            late_applied += 1
            stale_dropped += len(group) - 1
            at = through
        else:
            through = time
        if max_offset is None or offset > max_offset:
            max_offset = offset
        if new == value:
            continue
        steps.append((at, value, new))
        value = new
    return KeyState(value, through, max_offset), steps, late_applied, stale_dropped


def resolve_prior(key: Any, priors: List[Any]) -> Tuple[Any, List[Invalid]]:
    """Picks a key's snapshot value; conflicting duplicates become :class:`Invalid`.

    A snapshot should hold each key once. When it does not, the pick must not
    depend on arrival order, and the conflict is reported, not hidden.
    """
    if not priors:
        return None, []
    ordered = sorted(priors, key=_tiebreak)
    kept = ordered[-1]
    conflicts = [
        Invalid((key, other), f"prior: key {key!r} appears more than once in the "
                f"snapshot with different values; kept {kept!r}")
        for other in ordered[:-1] if other != kept
    ]
    return kept, conflicts


def transition_changes(key: Any, old: Any, new: Any) -> List[Change]:
    """The changes of one step: retract ``old`` (if any), insert ``new`` (if any)."""
    out = []
    if old is not None:
        out.append(Change(key, old, -1))
    if new is not None:
        out.append(Change(key, new, +1))
    return out
