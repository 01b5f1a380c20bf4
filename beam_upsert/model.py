"""Commands, changes, and the per-key upsert rule shared by every flavor.

Both Beam flavors, the columnar path (for its rare slow cases) and the tests
call :func:`apply_times`, so they cannot drift apart: the flavors differ only
in how commands reach it.

The rules beyond DESIGN.md's "Upsert semantics", in one place:

* **Offset classes.** Offsets only order against offsets of their class:
  numbers (``int``, ``bool``, ``float``, ``Decimal``), ``str``, ``bytes``,
  and tuples of one length whose parts are pairwise of one class. A key that
  holds a value remembers the class of the offsets that made it; a later
  command whose offset is of another class does not order against them and
  goes to ``invalid``. For a key that holds nothing (never written, deleted,
  or only seeded by the snapshot), the commands of one time that share the
  class most of them use are kept and the others go to ``invalid``; on a tie
  the first class in the order numbers, ``str``, ``bytes``, tuples (shorter
  first, then by their parts' classes) is kept. Times are applied in
  ascending order, so the choice never depends on arrival order.
* **Equal offsets.** Among commands of one key and time with the greatest
  offset, a value beats a delete (``None``), and among values the one with
  the greatest ``(type name, repr(value))`` wins (:func:`value_order_key`).
  Duplicate snapshot keys keep their value by the same order and report the
  others.
* **Tombstones.** With ``tombstones`` (the stateful flavor's default), a
  key that ends a time without a value keeps a *tombstone*: the time it last
  applied and the greatest offset it applied, so a late command for a deleted
  key follows the offset rule exactly as one for a live key does. A
  tombstone does not fix the key's offset class: the next on-time command
  picks its class afresh, as for a key that never held anything (the grouped
  flavor never sees a tombstone, and the two must agree); only a *late*
  command must order against the tombstone's offset. Without ``tombstones``
  (``tombstone_retention=0``) a key without a value keeps nothing and a late
  command for it is applied fresh at its own time.
* **Too late.** A key that holds neither a value nor a tombstone (its
  tombstone was dropped after the retention horizon, or it was never seen)
  has nothing to compare a late command's offset with. The stateful flavor
  passes its shard's *forget frontier* (``forgotten_through``: the newest
  time of any tombstone the shard dropped); a command for such a key at or
  below it is *too late*: it is refused, never applied, because it might be
  older than the delete that was forgotten. Above it, the command is applied
  fresh at its own time, above every change the key ever emitted.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import math
import numbers
from operator import itemgetter
from typing import Any, Hashable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

__all__ = [
    "Applied",
    "Change",
    "UpsertCommand",
    "UpsertError",
    "Invalid",
    "KeyState",
    "apply_times",
    "check_command",
    "check_key",
    "class_name",
    "offset_class",
    "resolve_prior",
    "resume_micros",
    "retention_micros",
    "retention_text",
    "too_late_reason",
    "transition_changes",
    "value_order_key",
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
    commands in the stateful flavor. With ``value`` ``None`` and both set,
    the state is a *tombstone*; without tombstones both are ``None``
    whenever ``value`` is.
    """

    value: Any = None
    applied_through: Optional[int] = None
    max_offset: Any = None


class Applied(NamedTuple):
    """What :func:`apply_times` did to one key.

    ``steps`` are ``(time_micros, old, new)`` with ``old != new``;
    ``invalid`` are ``(time_micros, offset, value, reason)`` of commands whose
    offset does not order against the key's others; ``too_late`` are
    ``(time_micros, offset, value)`` of commands refused as too late (see
    the module docstring).
    """

    state: KeyState
    steps: List[Tuple[int, Any, Any]]
    late_applied: int
    stale_dropped: int
    invalid: List[Tuple[int, Any, Any, str]]
    too_late: Sequence[Tuple[int, Any, Any]] = ()


_KEY_SCALARS = (str, bytes, int, bool)
_OFFSET_SCALARS = (str, bytes, int)


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


_EXACT_KEYS = frozenset((str, bytes, int, float, bool))


def plain_key(key: Any) -> Any:
    """A checked ``key`` with its parts of a subclass of str, bytes, int or float
    as their plain values (Enum members excepted), or ``key`` itself when none is.

    Such a subclass has no deterministic encoding of its own (Beam's coder
    refuses it, or pickles its state, which may not hold its value); its plain
    value is equal to it and hashes alike, so it is the same key to Python too.
    The values are taken past any override of ``__str__``, ``__int__`` and the like.
    """
    kind = type(key)
    if kind in _EXACT_KEYS or isinstance(key, enum.Enum):
        return key
    if isinstance(key, tuple):
        if kind is tuple and all(type(part) in _EXACT_KEYS for part in key):
            return key   # (the common tuple key, without rebuilding it)
        parts = tuple(plain_key(part) for part in key)
        same = all(new is old for new, old in zip(parts, key))
        if hasattr(kind, "_fields") and hasattr(kind, "_make"):
            # A named tuple keeps its class (Beam's coder encodes it as one).
            return key if same else kind._make(parts)
        return key if same and kind is tuple else parts
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bytes):
        return bytes(memoryview(key))
    if isinstance(key, int):
        return int.__int__(key)
    if isinstance(key, float):
        return float.__float__(key)
    return key


def _check_offset(offset: Any) -> Optional[str]:
    if offset is None:
        return "offset is None"
    if isinstance(offset, _OFFSET_SCALARS):
        return None
    if isinstance(offset, float):
        return None if not math.isnan(offset) else "offset is NaN, which is not orderable"
    if isinstance(offset, decimal.Decimal):
        # A Decimal NaN raises when compared, a signalling one even on ==.
        return None if not offset.is_nan() else "offset is NaN, which is not orderable"
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


# Offset classes are tuples of ints (and of classes, for tuple offsets), so
# any two classes compare: that orders the tie-break between classes.
_NUMBER, _STR, _BYTES, _TUPLE = (0,), (1,), (2,), 3
_SCALAR_CLASSES = {
    int: _NUMBER, bool: _NUMBER, float: _NUMBER, decimal.Decimal: _NUMBER,
    str: _STR, bytes: _BYTES,
}


def offset_class(offset: Any) -> tuple:
    """The class of a checked offset: offsets of one class always order.

    Args:
        offset: an offset that passed :func:`check_command`.

    Returns:
        ``(0,)`` numbers, ``(1,)`` str, ``(2,)`` bytes, ``(3, n, *parts)``
        a tuple of ``n`` parts; classes compare with each other.
    """
    cls = _SCALAR_CLASSES.get(type(offset))
    if cls is not None:
        return cls
    if isinstance(offset, tuple):
        return (_TUPLE, len(offset)) + tuple(offset_class(part) for part in offset)
    if isinstance(offset, (int, float, decimal.Decimal)):
        return _NUMBER
    return _STR if isinstance(offset, str) else _BYTES


def class_name(cls: tuple) -> str:
    """A readable name of an :func:`offset_class` result, for reasons."""
    if cls[0] == _TUPLE:
        return "tuple(" + ", ".join(class_name(part) for part in cls[2:]) + ")"
    return ("number", "str", "bytes")[cls[0]]


def value_order_key(value: Any) -> Tuple[bool, str, str]:
    """The order that breaks ties between values (equal offsets, duplicate priors).

    A value beats a delete (``None``); among values the greatest
    ``(type name, repr)`` wins. It depends on the values only, never on
    arrival order, and the columnar path applies the same function.
    """
    return (value is not None, type(value).__name__, repr(value))


_first = itemgetter(0)


def winner(commands: List[Tuple[Any, Any]]) -> Tuple[Any, Any]:
    """The ``(offset, value)`` with the greatest offset; ties by :func:`value_order_key`.

    Args:
        commands: a non-empty list whose offsets are of one class.
    """
    if len(commands) == 1:
        return commands[0]
    best = max(commands, key=_first)
    top = best[0]
    tied = [c for c in commands if c[0] == top]
    if len(tied) == 1:
        return best
    return max(tied, key=lambda c: value_order_key(c[1]))


def _keep_class(group, cls, time, invalid, why) -> list:
    kept = []
    for command in group:
        other = offset_class(command[0])
        if other == cls:
            kept.append(command)
        else:
            invalid.append((time, command[0], command[1], (
                f"offset {command[0]!r} ({class_name(other)}) does not order against "
                f"the {class_name(cls)} offsets {why}")))
    return kept


def _of_live_class(group, max_offset, key, time, invalid, what="current value") -> list:
    # The common case first: scalars of the very type already applied.
    kind = type(max_offset)
    if kind is not tuple and all(type(c[0]) is kind for c in group):
        return group
    return _keep_class(group, offset_class(max_offset), time, invalid,
                       f"that made the {what} of key {key!r}")


def _of_majority_class(group, key, time, invalid) -> list:
    counts: dict = {}
    for command in group:
        cls = offset_class(command[0])
        counts[cls] = counts.get(cls, 0) + 1
    if len(counts) == 1:
        return group
    # Most commands first; on a tie the smallest class (numbers, str, bytes, tuples).
    cls = min(counts, key=lambda c: (-counts[c], c))
    return _keep_class(group, cls, time, invalid, (
        f"kept for key {key!r} at time {time} µs (the class most of its commands "
        f"there use; on a tie numbers, str, bytes, then tuples)"))


def apply_times(
    state: KeyState,
    commands: Iterable[Tuple[int, Any, Any]],
    *,
    key: Any = None,
    late_ok: bool = False,
    tombstones: bool = False,
    forgotten_through: Optional[int] = None,
) -> Applied:
    """Applies ``(time_micros, offset, value)`` commands to one key.

    Commands are collapsed per time to the greatest offset and applied in
    ascending time order (see the module docstring for offset classes and
    ties). With ``late_ok`` (the stateful flavor), a time at or before
    ``state.applied_through`` is late: its winner is applied at
    ``applied_through`` if its offset is newer than every offset already
    applied, otherwise it is dropped. Whenever the key ends a time without a
    value, its state is emptied, or, with ``tombstones``, becomes a
    tombstone that keeps the time and offset.

    Args:
        state: what the key holds before these commands.
        commands: the key's commands, in any order.
        key: the key, named in the reasons of refused commands.
        late_ok: apply the late rule (stateful flavor).
        tombstones: keep a deleted key's applied time and offset.
        forgotten_through: while the key holds neither a value nor a
            tombstone, its commands at or below this time (micros) are too
            late and refused (``Applied.too_late``).

    Returns:
        An :class:`Applied`; :func:`transition_changes` turns each step into
        changes.
    """
    by_time: dict = {}
    for time, offset, value in commands:
        group = by_time.get(time)
        if group is None:
            by_time[time] = [(offset, value)]
        else:
            group.append((offset, value))
    value, through, max_offset = state
    steps: List[Tuple[int, Any, Any]] = []
    invalid: List[Tuple[int, Any, Any, str]] = []
    too_late: List[Tuple[int, Any, Any]] = []
    late_applied = stale_dropped = 0
    for time in sorted(by_time):
        group = by_time[time]
        late = late_ok and through is not None and time <= through
        if (value is None and through is None and forgotten_through is not None
                and time <= forgotten_through):
            too_late.extend((time, offset, new) for offset, new in group)
            continue
        if max_offset is not None and (value is not None or late):
            group = _of_live_class(group, max_offset, key, time, invalid,
                                   "current value" if value is not None else "deletion")
        elif len(group) > 1:
            group = _of_majority_class(group, key, time, invalid)
        if not group:
            continue
        offset, new = winner(group)
        at = time
        if late:
            if not offset > max_offset:
                stale_dropped += len(group)
                continue
            late_applied += 1
            stale_dropped += len(group) - 1
            at = through
        else:
            through = time
        if max_offset is None or (value is None and _other_class(offset, max_offset)) \
                or offset > max_offset:
            # After a delete an on-time command picks its class afresh.
            max_offset = offset
        if not new == value:
            steps.append((at, value, new))
            value = new
        if value is None and not tombstones:
            # No tombstone: a key without a value keeps nothing.
            through = max_offset = None
    return Applied(KeyState(value, through, max_offset), steps, late_applied,
                   stale_dropped, invalid, too_late)


def _other_class(offset: Any, other: Any) -> bool:
    # Scalars of one type are of one class; tuples of one length may not be
    # ((2, 2) and (2, "y")), so they are compared part by part.
    if type(offset) is type(other) and type(offset) is not tuple:
        return False
    return offset_class(offset) != offset_class(other)


def too_late_reason(key: Any, time: int, forgotten_through: int, retention_micros: int) -> str:
    """Why a command for a key without value or tombstone was refused as too late."""
    return (
        f"too late: the command for key {key!r} at time {time} µs is at or below "
        f"{forgotten_through} µs, the newest tombstone its state shard has dropped "
        f"(tombstone_retention {retention_text(retention_micros)}), and no value or "
        "tombstone is held for the key to compare its offset with; applying it could "
        "resurrect a deleted key")


def resolve_prior(key: Any, priors: List[Any]) -> Tuple[Any, List[Invalid]]:
    """Picks a key's snapshot value; conflicting duplicates become :class:`Invalid`.

    A snapshot should hold each key once. When it does not, the greatest
    value by :func:`value_order_key` is kept (never the first to arrive), and
    each other value is reported as ``Invalid((key, value), reason)``.
    """
    if not priors:
        return None, []
    if len(priors) == 1:
        return priors[0], []
    ordered = sorted(priors, key=value_order_key)
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


def resume_micros(resume_at: Any, *, where: str) -> Optional[int]:
    """The resume frontier in microseconds since the epoch.

    One rule for every entry point: an apache_beam ``Timestamp``, or a plain
    ``int`` of **microseconds** (the unit of the columnar ``time`` column and
    of a table's frontier). Floats and other types are refused rather than
    guessed at: ``Timestamp(seconds)`` says seconds unambiguously.

    Args:
        resume_at: ``None`` (drop nothing), a ``Timestamp`` or an int.
        where: the caller, named in the error.

    Raises:
        TypeError: ``resume_at`` is neither a Timestamp nor an int.
        ValueError: the int is outside Beam's timestamp range.
    """
    if resume_at is None:
        return None
    if isinstance(resume_at, Timestamp):
        return resume_at.micros
    if isinstance(resume_at, numbers.Integral) and not isinstance(resume_at, bool):
        micros = int(resume_at)
        if not MIN_TIMESTAMP.micros <= micros <= MAX_TIMESTAMP.micros:
            raise ValueError(
                f"{where}: resume_at={micros} µs is outside Beam's timestamp range")
        return micros
    raise TypeError(
        f"{where}: resume_at must be an apache_beam Timestamp or an int of "
        f"microseconds since the epoch, got {type(resume_at).__name__} {resume_at!r} "
        f"(for seconds write Timestamp({resume_at!r}))")


def retention_text(micros: int) -> str:
    """A retention for people: ``3600 s``, ``0.5 s`` (never exponent notation)."""
    seconds, rest = divmod(micros, 1_000_000)
    return f"{seconds} s" if not rest else f"{micros / 1e6:.6f}".rstrip("0") + " s"


def retention_micros(retention: Any, *, where: str) -> int:
    """``tombstone_retention`` in microseconds: a ``Duration`` or int/float seconds.

    Raises:
        TypeError: neither a Duration nor a number of seconds.
        ValueError: negative or not finite.
    """
    if isinstance(retention, Duration):
        micros = retention.micros
    elif isinstance(retention, numbers.Real) and not isinstance(retention, (bool, decimal.Decimal)):
        if not math.isfinite(retention):
            raise ValueError(
                f"{where}: tombstone_retention must be finite, got {retention!r}")
        micros = round(float(retention) * 1_000_000) if not isinstance(
            retention, numbers.Integral) else int(retention) * 1_000_000
        if micros == 0 and retention > 0:
            raise ValueError(
                f"{where}: tombstone_retention {retention!r} s is below one microsecond; "
                "give 0 to keep no tombstones, or at least 1e-6 s")
    else:
        raise TypeError(
            f"{where}: tombstone_retention must be an apache_beam Duration or a number "
            f"of seconds, got {type(retention).__name__} {retention!r}")
    if micros < 0:
        raise ValueError(
            f"{where}: tombstone_retention must be >= 0 (0 keeps no tombstones), got "
            f"{retention!r}")
    return micros
