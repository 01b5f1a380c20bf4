"""Why a row does not fit a table, in words a user can act on.

The writes conform a whole batch at once; only when that fails do they come
here, to find the offending rows column by column and say of each one which
column, what the table expects and what the row holds, e.g.
``column 'reading' expects int64, got str 'abc'`` or ``column 'emb' expects
8 float32 values, got 5``. The callers put the row's name in front (its key,
its id or its position: :func:`row_label`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from beam_supertable.format.schema import TOO_LARGE, overflowing_row

_MISSING = object()
_CONVERT_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)
_FLOAT_NAMES = {pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64"}
_NON_FINITE = {"nan": "NaN", "inf": "infinity", "-inf": "minus infinity"}
_SHORT = 60   # characters of a value's repr in a reason


def type_name(t: pa.DataType) -> str:
    """A type as a reason names it (``float32``, not Arrow's ``float``)."""
    if pa.types.is_fixed_size_list(t):
        return f"{t.list_size} {type_name(t.value_type)} values"
    return _FLOAT_NAMES.get(t, str(t))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHORT else text[:_SHORT - 3] + "..."


def got(value: Any) -> str:
    """What a row holds, for ``got ...``: its type and (shortened) value."""
    if value is None:
        return "null"
    return f"{type(value).__name__} {_short(value)}"


def id_column(schema: pa.Schema) -> Optional[str]:
    """The column that names a row of an unkeyed table: ``id``, else the first ``*_id``."""
    names = [n for n in schema.names if n.lower() == "id"] or \
        [n for n in schema.names if n.lower().endswith("_id")]
    return names[0] if names else None


def row_label(row: Any, position: Any, id_col: Optional[str]) -> str:
    """``row with id 'doc-7'`` when the row has a plain id, else ``row <position>``."""
    if id_col is not None and isinstance(row, Mapping):
        value = row.get(id_col)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return f"row with {id_col} {value!r}"
    return f"row {position}"


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _vector_problem(field: pa.Field, value: Any, finite: bool) -> Optional[str]:
    """A fixed-size list's problem: not a list, a wrong length, a value that is
    not of the item type, or (``finite``: the indexed vector) NaN or infinity."""
    t = field.type
    want = f"column {field.name!r} expects {type_name(t)}"
    if not _is_sequence(value):
        try:   # Arrow takes some other values as lists (bytes as a list of ints)
            values = pa.array([value], type=t).to_pylist()[0]
        except _CONVERT_ERRORS:
            return f"{want}, got {got(value)}"
    else:
        values = list(np.asarray(value).ravel()) if isinstance(value, np.ndarray) else list(value)
    if len(values) != t.list_size or (isinstance(value, np.ndarray) and value.ndim != 1):
        shape = f" (shape {value.shape})" if isinstance(value, np.ndarray) else ""
        return f"{want}, got {len(values)}{shape}"
    for i, v in enumerate(values):
        if v is None and finite:
            return f"{want}, got null at position {i}"
        try:
            pa.array([v], type=t.value_type)
        except _CONVERT_ERRORS:
            return f"{want}, got {got(v)} at position {i}"
    if finite:
        item_name = type_name(t.value_type)
        want = f"column {field.name!r} expects {t.list_size} finite {item_name} values"
        try:
            wide = pa.array(values, pa.float64())
            # Cast as conform casts (unsafe: float64 narrows to float32).
            narrowed = wide.cast(t.value_type, safe=False).to_numpy(zero_copy_only=False)
        except _CONVERT_ERRORS:
            return None   # not found here: conform's own message tells
        for i, (v, n) in enumerate(zip(wide.to_pylist(), narrowed)):
            if not math.isfinite(v):
                return f"{want}, got {_NON_FINITE.get(str(v), v)} at position {i}"
            if not np.isfinite(n):   # finite here, but not once narrowed to the table's floats
                return f"{want}, got {v!r} at position {i}, beyond {item_name}'s range"
        if overflowing_row(np.asarray(narrowed, np.float64)[None, :]) is not None:
            return f"column {field.name!r}: the vector {TOO_LARGE}"
    return None


def value_problem(field: pa.Field, value: Any, *, vector: bool = False) -> Optional[str]:
    """Why ``value`` cannot be stored in ``field`` (``column 'c' expects ..., got
    ...``), or None when it can.

    Args:
        field: the table's column.
        value: the row's value; ``_MISSING`` when the row lacks the column.
        vector: the column is the table's indexed vector column: every row
            needs one, of finite values.
    """
    if value is _MISSING or value is None:
        if field.nullable and not vector:
            return None
        want = f"column {field.name!r} expects {type_name(field.type)}"
        why = "every row needs a vector" if vector else "the column is not nullable"
        if value is _MISSING:
            return f"{want}, but the row lacks it ({why})"
        return f"{want}, got null ({why})"
    if pa.types.is_fixed_size_list(field.type):
        problem = _vector_problem(field, value, vector)
        if problem is not None:
            return problem
    try:
        pa.array([value], type=field.type)
        return None
    except _CONVERT_ERRORS as exc:
        out = f"column {field.name!r} expects {type_name(field.type)}, got {got(value)}"
        if isinstance(value, int) and pa.types.is_integer(field.type):
            return f"{out}, outside {field.type}'s range"
        if pa.types.is_nested(field.type):   # where inside it, in Arrow's words
            return f"{out} ({exc})"
        return out


def row_problem(row: Any, schema: pa.Schema, vector_column: Optional[str]) -> Optional[str]:
    """The first reason ``row`` does not fit ``schema``, or None when none is found."""
    if not isinstance(row, Mapping):
        return f"expected a dict of the table's columns {schema.names}, got {got(row)}"
    extra = [k for k in row if k not in schema.names]
    if extra:
        return f"column(s) {extra} are not in the table schema {schema.names}"
    for field in schema:
        problem = value_problem(field, row.get(field.name, _MISSING),
                                vector=field.name == vector_column)
        if problem is not None:
            return problem
    return None


def find_problems(rows: Sequence[Any], schema: pa.Schema,
                  vector_column: Optional[str]) -> Dict[int, str]:
    """Position -> reason for each row of ``rows`` found not to fit ``schema``.

    Column by column: a column whose values all convert at once is passed
    over; only in one that does not is each value looked at. Rows not named
    fit every column (the caller conforms them together, and is left with
    conform's own message should they still fail).
    """
    problems: Dict[int, str] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or not all(k in schema.names for k in row):
            problems[i] = row_problem(row, schema, vector_column)
    for field in schema:
        live = [i for i in range(len(rows)) if i not in problems]
        if not live:
            break
        values = [rows[i].get(field.name, _MISSING) for i in live]
        vector = field.name == vector_column
        if not vector and (field.nullable or not any(v is None or v is _MISSING
                                                     for v in values)):
            try:
                pa.array([None if v is _MISSING else v for v in values], type=field.type)
                continue
            except _CONVERT_ERRORS:
                pass
        for i, value in zip(live, values):
            problem = value_problem(field, value, vector=vector)
            if problem is not None:
                problems[i] = problem
    return problems
