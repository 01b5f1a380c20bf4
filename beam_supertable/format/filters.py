"""Filters: per-superfile column statistics, pruning by them, and row masks.

Statistics ride in each manifest entry as JSON data:

* ``stats``: ``{column: [lo, hi]}``, bounds of the column's non-null values
  (``lo <= every value <= hi``; ``null`` for a side with no finite bound).
  Integers are JSON integers (exact at any size), floats JSON numbers (a
  column holding NaN has no bounds), booleans JSON booleans, timestamps and
  dates integer nanoseconds since the Unix epoch (UTC for zoned timestamps).
  Strings are cut the way Parquet cuts them: ``lo`` to a prefix of at most
  ``STRING_STATS_BYTES`` UTF-8 bytes, ``hi`` to such a prefix with its last
  incrementable code point incremented, so every entry stays small.
* ``null_counts``: ``{column: nulls}`` for every column the superfile
  holds (nothing is assumed of a column missing from it).
* ``id_min`` / ``id_max``: the range of ``_id``.

Entries of older tables hold whole strings, timestamps and dates as ISO 8601
text, and no ``null_counts``; they are read as the bounds they are, with
nulls and NaN assumed possible.

Pruning (``Pruner``) walks the filter's expression tree and asks, for each
superfile, whether some row could make it true. Comparisons are exact (an
int64 beyond 2**53 compares as an integer; an integer column against a float
literal compares as Arrow does, in float64). ``and``/``or``/``not``/``xor``,
``is_in``, ``is_null``/``is_valid``, a boolean column or literal, and
comparisons with the column on either side are understood; anything else
keeps the superfile: pruning is an optimization, never an error.
"""

from __future__ import annotations

import bisect
import datetime
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from beam_supertable.format.fields import field_id, schema_mapping
from beam_supertable.format.expression import Call, Field, Literal, Node, parse
from beam_supertable.format.schema import ID

__all__ = ["STRING_STATS_BYTES", "Pruner", "column_stats", "mask", "may_match", "null_counts"]

STRING_STATS_BYTES = 64       # a string bound keeps at most this many UTF-8 bytes
_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_DAY_NS = 86_400 * 10**9
_EPOCH = datetime.datetime(1970, 1, 1)
_MAX_CODE_POINT = 0x10FFFF


# -- statistics (writing) ------------------------------------------------------
def column_stats(table: pa.Table) -> Dict[str, List[Any]]:
    """Per-column ``[lo, hi]`` bounds for the columns a filter can prune on (JSON data)."""
    stats = {}
    for name in table.column_names:
        col = table.column(name)
        t = col.type
        if col.null_count == len(col):
            continue
        if pa.types.is_floating(t):
            if pc.any(pc.is_nan(col)).as_py():
                continue  # NaN passes "!=" and "not <": no bounds describe it
            mm = pc.min_max(col)
            lo, hi = float(mm["min"].as_py()), float(mm["max"].as_py())
            stats[name] = [lo if np.isfinite(lo) else None, hi if np.isfinite(hi) else None]
        elif pa.types.is_integer(t) or pa.types.is_boolean(t):
            mm = pc.min_max(col)
            stats[name] = [mm["min"].as_py(), mm["max"].as_py()]
        elif pa.types.is_timestamp(t) or pa.types.is_date(t):
            mm = pc.min_max(col)
            stats[name] = [_time_ns(mm["min"]), _time_ns(mm["max"])]
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            mm = pc.min_max(col)
            stats[name] = [truncate_min(mm["min"].as_py()), truncate_max(mm["max"].as_py())]
    return stats


def null_counts(table: pa.Table) -> Dict[str, int]:
    """``{column: nulls}`` for every column of ``table`` (JSON data)."""
    return {name: int(table.column(name).null_count) for name in table.column_names}


def truncate_min(value: str, limit: int = STRING_STATS_BYTES) -> str:
    """A lower bound of ``value`` in at most ``limit`` UTF-8 bytes: its longest such prefix."""
    data = value.encode()
    if len(data) <= limit:
        return value
    return data[:limit].decode(errors="ignore")  # drops a code point cut in half


def truncate_max(value: str, limit: int = STRING_STATS_BYTES) -> Optional[str]:
    """An upper bound of ``value`` in at most ``limit`` UTF-8 bytes, None if none exists.

    The prefix with its last incrementable code point incremented (surrogates
    are skipped, U+10FFFF cannot grow): every string starting with the prefix
    sorts before it.
    """
    if len(value.encode()) <= limit:
        return value
    prefix = truncate_min(value, limit)
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000
        if code > _MAX_CODE_POINT:
            continue
        bound = prefix[:i] + chr(code)
        if len(bound.encode()) <= limit:
            return bound
    return None


def _time_ns(scalar: pa.Scalar) -> int:
    t = scalar.type
    if pa.types.is_timestamp(t):
        return scalar.value * _NS_PER[t.unit]
    if pa.types.is_date32(t):
        return scalar.value * _DAY_NS
    return scalar.value * 10**6  # date64: milliseconds


# -- pruning ---------------------------------------------------------------------
# A verdict is (some row may make it true, some row may make it false); a
# null result is neither, as a filter drops it.
Verdict = Tuple[bool, bool]
_UNKNOWN: Verdict = (True, True)
_NEVER: Verdict = (False, False)
_FLIP = {"less": "greater", "greater": "less", "less_equal": "greater_equal",
         "greater_equal": "less_equal", "equal": "equal", "not_equal": "not_equal"}


@dataclass(frozen=True)
class _Value:
    """A literal, or a statistics bound, in a comparable domain."""

    kind: str   # "int", "float", "float32", "bool", "str", "time"
    value: Any


@dataclass(frozen=True)
class _Column:
    """What one entry tells about one column."""

    kind: Optional[str]           # None: no usable bounds
    lo: Any = None                # None: unbounded below
    hi: Any = None                # None: unbounded above
    nulls: Optional[int] = None   # None: unknown
    rows: int = 0
    nan: bool = True              # NaN may occur (float columns)

    def all_null(self) -> bool:
        return self.nulls is not None and self.nulls >= self.rows

    def may_null(self) -> bool:
        return self.nulls is None or self.nulls > 0


class Pruner:
    """Decides from a manifest entry's statistics whether a superfile may hold matches.

    Build it once per filter and call it on each entry::

        keep = Pruner(pc.field("year") >= 2020, table.schema)
        entries = [e for e in table.superfiles() if keep(e)]

    Args:
        expr: the filter.
        schema: the table's schema. Without it, column types are guessed
            from the statistics and string or temporal bounds are not used.
    """

    def __init__(self, expr: pc.Expression, schema: Optional[pa.Schema] = None) -> None:
        self._tree = parse(expr)
        self._schema = schema
        self._sets: Dict[int, Tuple[Optional[List[_Value]], bool]] = {}
        self._keys: Dict[Tuple[int, str], List[Any]] = {}
        self._literals: Dict[int, Optional[_Value]] = {}
        self._types: Dict[str, Optional[pa.DataType]] = {}

    def __call__(self, entry: dict) -> bool:
        if self._tree is None:
            return True
        try:
            return self._verdict(self._tree, entry)[0]
        except (TypeError, ValueError, KeyError, IndexError, OverflowError):
            return True  # statistics of an unexpected shape: keep the superfile

    # A verdict per node kind --------------------------------------------------
    def _verdict(self, node: Node, entry: dict) -> Verdict:
        if isinstance(node, Literal):
            v = node.value
            if not v.is_valid:
                return _NEVER
            return (v.as_py() is True, v.as_py() is False) if pa.types.is_boolean(v.type) \
                else _UNKNOWN
        if isinstance(node, Field):
            col = self._column(entry, node.name, "bool")
            if col.all_null():
                return _NEVER
            if col.kind != "bool":
                return _UNKNOWN
            return (col.hi is not False, col.lo is not True)
        if not isinstance(node, Call):
            return _UNKNOWN
        name, args = node.name, node.args
        if name in ("and", "and_kleene") and len(args) == 2:
            a, b = self._verdict(args[0], entry), self._verdict(args[1], entry)
            return (a[0] and b[0], a[1] or b[1])
        if name in ("or", "or_kleene") and len(args) == 2:
            a, b = self._verdict(args[0], entry), self._verdict(args[1], entry)
            return (a[0] or b[0], a[1] and b[1])
        if name in ("and_not", "and_not_kleene") and len(args) == 2:
            a, b = self._verdict(args[0], entry), self._verdict(args[1], entry)
            return (a[0] and b[1], a[1] or b[0])
        if name == "xor" and len(args) == 2:
            a, b = self._verdict(args[0], entry), self._verdict(args[1], entry)
            return ((a[0] and b[1]) or (a[1] and b[0]), (a[0] and b[0]) or (a[1] and b[1]))
        if name == "invert" and len(args) == 1:
            a = self._verdict(args[0], entry)
            return (a[1], a[0])
        if name in _FLIP and len(args) == 2:
            return self._comparison(name, args, entry)
        if name in ("is_null", "is_valid") and len(args) == 1 and isinstance(args[0], Field):
            return self._nullness(name, node, entry)
        if name == "is_in" and len(args) == 1 and isinstance(args[0], Field):
            return self._is_in(node, entry)
        return _UNKNOWN

    def _comparison(self, op: str, args, entry: dict) -> Verdict:
        a, b = args
        if isinstance(a, Literal) and isinstance(b, Field):
            a, b, op = b, a, _FLIP[op]
        if not (isinstance(a, Field) and isinstance(b, Literal)):
            return _UNKNOWN
        if not b.value.is_valid:
            return _NEVER  # a comparison with null is null for every row
        if id(b) not in self._literals:
            self._literals[id(b)] = _literal(b.value)
        lit = self._literals[id(b)]
        if lit is None:
            return _UNKNOWN
        col = self._column(entry, a.name, lit.kind)
        if col.all_null():
            return _NEVER
        domain = _domain(col.kind, lit.kind)
        if domain is None:
            return _UNKNOWN
        v = _as(domain, lit.value)
        lo = None if col.lo is None else _as(domain, col.lo)
        hi = None if col.hi is None else _as(domain, col.hi)
        if isinstance(v, float) and v != v:
            return _UNKNOWN
        gt = hi is None or hi > v
        ge = hi is None or hi >= v
        lt = lo is None or lo < v
        le = lo is None or lo <= v
        only_v = lo is not None and lo == hi == v
        verdict = {"greater": (gt, le), "greater_equal": (ge, lt), "less": (lt, ge),
                   "less_equal": (le, gt), "equal": (le and ge, not only_v),
                   "not_equal": (not only_v, le and ge)}[op]
        if domain.startswith("float") and col.nan:
            # NaN rows are false for every comparison but "!=", true for it.
            verdict = (True, verdict[1]) if op == "not_equal" else (verdict[0], True)
        return verdict

    def _nullness(self, name: str, node: Call, entry: dict) -> Verdict:
        col = self._column(entry, node.args[0].name, None)
        if col.nulls is None:
            return _UNKNOWN
        some_null = col.nulls > 0
        some_valid = col.nulls < col.rows
        nan_is_null = node.options is not None and "nan_is_null" in _fields(node.options) \
            and node.options["nan_is_null"].as_py()
        if nan_is_null and (col.kind in (None, "float")) and col.nan:
            return _UNKNOWN
        return (some_null, some_valid) if name == "is_null" else (some_valid, some_null)

    def _is_in(self, node: Call, entry: dict) -> Verdict:
        values, has_null = self._value_set(node)
        if values is None:
            return _UNKNOWN
        field_type = self._field_type(node.args[0].name)
        set_type = node.options["value_set"].values.type
        if field_type is not None and not set_type.equals(field_type):
            # Arrow casts the value set to the column's type (0.1 to float32, a
            # timestamp to a date); comparing in the set's own type could prune
            # a superfile that holds a match, so such a filter keeps it.
            return _UNKNOWN
        col = self._column(entry, node.args[0].name, values[0].kind if values else None)
        null_hit = has_null and col.may_null()
        if not values:
            return (null_hit, True)
        if col.all_null():
            return (null_hit, True)
        domain = _domain(col.kind, values[0].kind)
        if domain is None:
            return _UNKNOWN
        keys = self._keys.get((id(node), domain))
        if keys is None:  # sorted still: the casts are monotone
            keys = self._keys[(id(node), domain)] = [_as(domain, v.value) for v in values]
        lo = None if col.lo is None else _as(domain, col.lo)
        hi = None if col.hi is None else _as(domain, col.hi)
        i = 0 if lo is None else bisect.bisect_left(keys, lo)
        hit = i < len(keys) and (hi is None or keys[i] <= hi)
        nan = domain.startswith("float") and col.nan
        only_member = (lo is not None and lo == hi and hit and keys[i] == lo
                       and col.nulls == 0 and not nan)
        return (hit or null_hit, not only_member)

    def _value_set(self, node: Call) -> Tuple[Optional[List[_Value]], bool]:
        """The set's non-null values (sorted, one kind) and whether it holds null."""
        key = id(node)
        if key not in self._sets:
            out: Tuple[Optional[List[_Value]], bool] = (None, False)
            if node.options is not None and "value_set" in _fields(node.options):
                array = node.options["value_set"].values
                if array is not None:
                    has_null = array.null_count > 0
                    vals = [_literal(s) for s in array if s.is_valid]
                    if (all(v is not None and v.value == v.value for v in vals)
                            and len({v.kind for v in vals}) <= 1):
                        out = (sorted(vals, key=lambda v: v.value), has_null)
            self._sets[key] = out
        return self._sets[key]

    # What an entry says about a column ----------------------------------------
    def _held_name(self, entry: dict, name: str) -> Optional[str]:
        """The name the entry's statistics give the table's column ``name`` (by
        field id: it was renamed since, or is a new column of that name), or
        None when the superfile was written before the column existed."""
        if self._schema is None or name not in self._schema.names:
            return name
        ids = entry.get("field_ids")
        if not ids:
            # Written before ids were recorded: named as the table's name mapping says.
            ids = schema_mapping(self._schema)
            if ids is None:
                return name
        wanted = field_id(self._schema.field(name))
        if wanted is None or ids.get(name) == wanted:
            return name
        return next((n for n, i in ids.items() if i == wanted), None)

    def _column(self, entry: dict, name: str, literal_kind: Optional[str]) -> _Column:
        rows = int(entry.get("rows", 0))
        if name == ID:
            lo, hi = entry.get("id_min"), entry.get("id_max")
            if lo is None or hi is None:
                return _Column(None, rows=rows)
            return _Column("int", int(lo), int(hi), 0, rows, nan=False)
        held = self._held_name(entry, name)
        if held is None:    # the superfile predates the column: its values are null
            return _Column(None, nulls=rows, rows=rows)
        name_in_table, name = name, held
        counts = entry.get("null_counts")
        nulls = None if counts is None or name not in counts else int(counts[name])
        new_format = counts is not None
        bounds = (entry.get("stats") or {}).get(name)
        field_type = self._field_type(name_in_table)
        if bounds is None:
            return _Column(None, nulls=nulls, rows=rows)
        lo, hi = bounds
        kind = _kind_of(field_type, lo, hi, literal_kind)
        if kind is None:
            return _Column(None, nulls=nulls, rows=rows)
        if kind == "time" and not new_format:
            lo, hi = _old_time(lo, field_type, False), _old_time(hi, field_type, True)
        if kind == "float":
            lo = None if lo is None else float(lo)
            hi = None if hi is None else float(hi)
        return _Column(kind, lo, hi, nulls, rows, nan=kind == "float" and not new_format)

    def _field_type(self, name: str) -> Optional[pa.DataType]:
        if self._schema is None:
            return None
        if name not in self._types:
            i = self._schema.get_field_index(name)
            self._types[name] = None if i < 0 else self._schema.field(i).type
        return self._types[name]


def may_match(entry: dict, expr: pc.Expression, schema: Optional[pa.Schema] = None) -> bool:
    """False only when the entry's statistics rule out every row for ``expr``.

    One-off form of ``Pruner(expr, schema)(entry)``; build a ``Pruner`` to
    test many entries against one filter.
    """
    return Pruner(expr, schema)(entry)


def _fields(struct: pa.StructScalar) -> List[str]:
    return [f.name for f in struct.type]


def _literal(scalar: pa.Scalar) -> Optional[_Value]:
    """A non-null literal in its comparable domain, or None if pruning cannot use it."""
    t = scalar.type
    if pa.types.is_boolean(t):
        return _Value("bool", scalar.as_py())
    if pa.types.is_integer(t):
        return _Value("int", scalar.as_py())
    if pa.types.is_float64(t):
        return _Value("float", scalar.as_py())
    if pa.types.is_float32(t):
        return _Value("float32", scalar.as_py())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _Value("str", scalar.as_py())
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return _Value("time", _time_ns(scalar))
    return None


def _kind_of(field_type: Optional[pa.DataType], lo, hi, literal_kind: Optional[str]
             ) -> Optional[str]:
    """The domain a column's bounds live in."""
    if field_type is not None:
        if pa.types.is_boolean(field_type):
            return "bool"
        if pa.types.is_integer(field_type):
            return "int"
        if pa.types.is_floating(field_type):
            return "float"
        if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
            return "str"
        if pa.types.is_timestamp(field_type) or pa.types.is_date(field_type):
            return "time"
        return None
    # No schema: only what JSON itself tells apart.
    sample = [v for v in (lo, hi) if v is not None]
    if not sample:
        return None
    if all(isinstance(v, bool) for v in sample):
        return "bool"
    if any(isinstance(v, bool) for v in sample):
        return None
    if all(isinstance(v, int) for v in sample):
        return "int" if literal_kind in ("int", "float", "float32", None) else None
    if all(isinstance(v, (int, float)) for v in sample):
        return "float"
    return None  # text could be a string column or an older temporal one


def _old_time(value, field_type: Optional[pa.DataType], upper: bool) -> Optional[int]:
    """An older entry's ISO 8601 bound as nanoseconds, widened to stay a bound."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if len(value) == 10:  # a date
        days = (datetime.date.fromisoformat(value) - _EPOCH.date()).days
        extra = _DAY_NS - 1 if upper and field_type is not None and pa.types.is_date64(field_type) \
            else 0
        return days * _DAY_NS + extra
    dt = datetime.datetime.fromisoformat(value)
    if dt.tzinfo is not None:
        dt = dt.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    micros = (dt - _EPOCH) // datetime.timedelta(microseconds=1)
    # isoformat() kept microseconds; nanoseconds below them are unknown.
    return micros * 1000 + (999 if upper else 0)


def _domain(col_kind: Optional[str], lit_kind: str) -> Optional[str]:
    """Where a column and a literal compare, as Arrow would compare them."""
    if col_kind is None:
        return None
    if col_kind == lit_kind:
        return col_kind
    if col_kind == "float" and lit_kind in ("int", "float32"):
        return "float"  # the literal is cast to the column's float type: exactly, or an error
    if col_kind == "int" and lit_kind in ("float", "float32"):
        return lit_kind  # Arrow casts the integers to the literal's type (rounding, monotone)
    return None


def _as(domain: str, value):
    if domain == "float":
        return float(value)
    if domain == "float32":
        return float(np.float32(value))
    return value


# -- row masks -------------------------------------------------------------------
def mask(table: pa.Table, expr: pc.Expression) -> np.ndarray:
    """The rows of ``table`` for which ``expr`` is true (null counts as false)."""
    result = ds.dataset(table).to_table(columns={"m": expr})["m"]
    return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)


def pruned(entries: List[dict], expr: Optional[pc.Expression],
           schema: Optional[pa.Schema]) -> List[dict]:
    """The entries whose statistics do not rule ``expr`` out (all of them without a filter)."""
    if expr is None:
        return list(entries)
    keep: Callable[[dict], bool] = Pruner(expr, schema)
    return [e for e in entries if keep(e)]
