"""The comparisons behind ``beam_supertable.testing``: table rows and changelogs.

Each returns the failure message, or None when the two sides agree, so the
``assert_that`` matchers and the plain assert functions word a failure alike.
Rows and changes may hold unhashable values (dicts, lists), and floats are
compared with a tolerance, so neither side is hashed whole: rows are bucketed
by their exact columns and matched inside a bucket; changes are grouped by key
(keys are hashable) and matched by value equality inside a key.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

# A float32 vector round-trips with about 6e-8 relative error; 1e-6 leaves room.
DEFAULT_REL_TOL = 1e-6
DEFAULT_ABS_TOL = 1e-9
SHOWN = 20   # rows or keys listed per kind of difference; the rest are counted


# -- values ----------------------------------------------------------------------------
def plain(value: Any) -> Any:
    """``value`` as ``to_pylist`` returns it: numpy and tuples become lists and scalars."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


def close(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    """Equality with a float tolerance, through lists and dicts; NaN equals NaN."""
    if isinstance(a, float) or isinstance(b, float):
        if not (_is_number(a) and _is_number(b)):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel_tol, abs_tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel_tol, abs_tol) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in of an exact value (lists and dicts of hashables)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def has_float(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` holds floats anywhere (compared with a tolerance)."""
    if pa.types.is_floating(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return has_float(t.value_type)
    if pa.types.is_struct(t):
        return any(has_float(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return has_float(t.key_type) or has_float(t.item_type)
    return False


# -- table rows ------------------------------------------------------------------------
class RowDiff:
    """Compares expected rows with the rows a table holds, over ``columns``.

    Args:
        columns: the compared columns, in order.
        approx: the columns compared with the float tolerance.
        key: key columns (exact) to pair rows by, or empty to pair by content.
        ordered: compare position by position instead of as multisets.
    """

    def __init__(self, columns: Sequence[str], approx: Sequence[str], key: Sequence[str],
                 ordered: bool, rel_tol: float, abs_tol: float) -> None:
        self.columns = list(columns)
        self.approx = [c for c in self.columns if c in set(approx)]
        self.exact = [c for c in self.columns if c not in set(approx)]
        self.key = list(key)
        self.ordered = ordered
        self.rel_tol, self.abs_tol = rel_tol, abs_tol

    def equal(self, a: dict, b: dict) -> bool:
        return all(a[c] == b[c] for c in self.exact) and all(
            close(a[c], b[c], self.rel_tol, self.abs_tol) for c in self.approx)

    def changed(self, want: dict, got: dict) -> str:
        parts = [f"{c}: expected {want[c]!r}, got {got[c]!r}" for c in self.columns
                 if not (close(want[c], got[c], self.rel_tol, self.abs_tol)
                         if c in self.approx else want[c] == got[c])]
        return "; ".join(parts)

    def __call__(self, expected: List[dict], actual: List[dict]) -> Optional[str]:
        if self.ordered:
            return self._ordered(expected, actual)
        if self.key:
            return self._by_key(expected, actual)
        return self._multiset(expected, actual)

    def _multiset(self, expected, actual) -> Optional[str]:
        buckets: Dict[Hashable, List[dict]] = {}
        for row in actual:
            buckets.setdefault(tuple(_frozen(row[c]) for c in self.exact), []).append(row)
        missing = []
        for row in expected:
            bucket = buckets.get(tuple(_frozen(row[c]) for c in self.exact), [])
            hit = next((i for i, got in enumerate(bucket) if self.equal(row, got)), None)
            if hit is None:
                missing.append(row)
            else:
                bucket.pop(hit)
        unexpected = [row for bucket in buckets.values() for row in bucket]
        if not missing and not unexpected:
            return None
        return "\n".join(_listed("missing (expected, not in the table)", missing)
                         + _listed("unexpected (in the table, not expected)", unexpected))

    def _by_key(self, expected, actual) -> Optional[str]:
        def index(rows, side):
            out: Dict[Hashable, dict] = {}
            twice = []
            for row in rows:
                k = tuple(_frozen(row[c]) for c in self.key)
                if k in out:
                    twice.append(f"{self._key_text(row)} appears more than once {side}")
                out[k] = row
            return out, twice

        want, want_twice = index(expected, "in the expected rows")
        got, got_twice = index(actual, "in the table")
        missing = [want[k] for k in want if k not in got]
        unexpected = [got[k] for k in got if k not in want]
        changed = [f"{self._key_text(want[k])}: {self.changed(want[k], got[k])}"
                   for k in want if k in got and not self.equal(want[k], got[k])]
        lines = (_listed("duplicate keys", want_twice + got_twice, raw=True)
                 + _listed("missing keys (expected, not in the table)",
                           [f"{self._key_text(r)}: {r!r}" for r in missing], raw=True)
                 + _listed("unexpected keys (in the table, not expected)",
                           [f"{self._key_text(r)}: {r!r}" for r in unexpected], raw=True)
                 + _listed("changed rows", changed, raw=True))
        return "\n".join(lines) if lines else None

    def _ordered(self, expected, actual) -> Optional[str]:
        lines = [f"row {i}: {self.changed(w, g)}"
                 for i, (w, g) in enumerate(zip(expected, actual)) if not self.equal(w, g)]
        lines = _listed("rows that differ (in order)", lines, raw=True)
        if len(expected) > len(actual):
            lines += _listed(f"missing after row {len(actual) - 1}", expected[len(actual):])
        if len(actual) > len(expected):
            lines += _listed(f"unexpected after row {len(expected) - 1}", actual[len(expected):])
        return "\n".join(lines) if lines else None

    def _key_text(self, row: dict) -> str:
        return ", ".join(f"{c}={row[c]!r}" for c in self.key)


def _listed(title: str, items: Sequence[Any], raw: bool = False) -> List[str]:
    if not items:
        return []
    lines = [f"  {title}: {len(items)}"]
    lines += [f"    {item if raw else repr(item)}" for item in items[:SHOWN]]
    if len(items) > SHOWN:
        lines.append(f"    ... and {len(items) - SHOWN} more")
    return lines


# -- changelogs ------------------------------------------------------------------------
def change_parts(element: Any, where: str) -> Tuple[Any, Any, int]:
    """``(key, identity, diff)`` of a ``Change`` or a ``(key, value, diff, *more)`` tuple.

    The identity is the value, with any fields after ``diff`` (an event time,
    say) appended, so they take part in the comparison.
    """
    if not isinstance(element, tuple) or len(element) < 3:
        raise ValueError(f"{where}: expected Change(key, value, diff) or a tuple "
                         f"(key, value, diff, ...), got {element!r}")
    key, value, diff, *more = element
    if not isinstance(diff, numbers.Integral) or isinstance(diff, bool):
        raise ValueError(f"{where}: the diff of {element!r} must be an int (+1 or -1), "
                         f"got {diff!r}")
    return key, (value, *more) if more else value, int(diff)


def _tally(elements, where: str, consolidate: bool) -> Dict[Hashable, List[list]]:
    """Per key, ``[identity, count]`` pairs: net diffs, or counts of (identity, diff)."""
    out: Dict[Hashable, List[list]] = {}
    for i, element in enumerate(elements):
        key, ident, diff = change_parts(element, f"{where} element {i}")
        if not consolidate:
            ident, diff = (ident, diff), 1
        entries = out.setdefault(_frozen(key), [])
        for entry in entries:
            if entry[0] == ident:
                entry[1] += diff
                break
        else:
            entries.append([ident, diff])
    return out


def changelog_diff(expected, actual, *, consolidate: bool = True) -> Optional[str]:
    """The per-key difference of two changelogs, or None when they agree.

    With ``consolidate``, each (key, value) is compared by its net diff (a +1
    and a -1 of one value cancel); without, each (key, value, diff) by how
    many times it occurs.
    """
    want = _tally(expected, "expected", consolidate)
    got = _tally(actual, "changelog", consolidate)
    lines = []
    for key in list(want) + [k for k in got if k not in want]:
        ours, theirs = want.get(key, []), got.get(key, [])
        idents = [e[0] for e in ours] + [e[0] for e in theirs
                                         if not any(e[0] == o[0] for o in ours)]
        differ = []
        for ident in idents:
            a = next((e[1] for e in ours if e[0] == ident), 0)
            b = next((e[1] for e in theirs if e[0] == ident), 0)
            if a != b:
                differ.append(_change_line(ident, a, b, consolidate))
        if differ:
            lines.append(f"  key {key!r}:")
            lines += [f"    {d}" for d in differ]
    if not lines:
        return None
    keys = sum(1 for line in lines if line.startswith("  key "))
    how = ("net diff per value; a +1 and a -1 of one value cancel" if consolidate
           else "occurrences per (value, diff)")
    return f"the changelog differs at {keys} key(s) ({how}):\n" + "\n".join(lines)


def _change_line(ident: Any, expected: int, got: int, consolidate: bool) -> str:
    if consolidate:
        what = "missing" if got == 0 else "unexpected" if expected == 0 else "differs"
        return f"value {ident!r}: expected net {expected:+d}, got {got:+d} ({what})"
    value, diff = ident
    return f"({value!r}, {diff:+d}): expected {expected} time(s), got {got}"
