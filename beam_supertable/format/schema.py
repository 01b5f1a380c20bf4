"""Conforming user data to a table schema, with errors that name row and column."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import SchemaMismatchError

ID = "_id"

Data = Union[pa.Table, pa.RecordBatch, Sequence[pa.RecordBatch], Sequence[Mapping[str, Any]]]


def vector_dim(field: pa.Field) -> int:
    t = field.type
    if not (pa.types.is_fixed_size_list(t) and pa.types.is_floating(t.value_type)):
        raise SchemaMismatchError(
            f"vector column {field.name!r} must be a fixed_size_list of floats "
            f"(e.g. pa.list_(pa.float32(), 128)), got {t}")
    return t.list_size


def _offender(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    """``"column 'c', row i: "`` of the first value that makes no Arrow array, or ``""``."""
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            pa.array(values)
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        for i, value in enumerate(values):
            try:
                pa.array([value])
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                return f"column {name!r}, row {i}: "
        return f"column {name!r}: "
    return ""


def to_table(data: Data) -> Optional[pa.Table]:
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
    batches = list(data)
    if not batches:
        return None
    if all(isinstance(b, Mapping) for b in batches):
        # Row dicts: types are inferred here and cast to the schema by conform,
        # whose errors name the column and row.
        # from_pylist takes its columns from the first row: a key that only a
        # later row has (a misspelled column) would vanish without a word.
        # Take every row's keys, so conform names an unknown one wherever it is.
        names = list(dict.fromkeys(k for row in batches for k in row))
        try:
            return pa.Table.from_pydict({k: [row.get(k) for row in batches] for k in names})
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            # (OverflowError: an int beyond 64 bits.) Name the column and row.
            raise SchemaMismatchError(
                f"row dicts do not make a table: {_offender(batches, names)}{exc}") from exc
    if not all(isinstance(b, pa.RecordBatch) for b in batches):
        kind = Mapping if isinstance(batches[0], Mapping) else pa.RecordBatch
        bad = next(type(b).__name__ for b in batches if not isinstance(b, kind))
        raise TypeError(f"append takes a pyarrow Table, a RecordBatch, RecordBatches or row "
                        f"dicts, got {bad}")
    return pa.Table.from_batches(batches)


def conform(uri: str, data: Data, user_schema: pa.Schema,
            vector_column: Optional[str] = None) -> pa.Table:
    """Casts ``data`` to ``user_schema`` (the table schema without ``_id``).

    Raises:
        SchemaMismatchError: an unknown or missing non-nullable column, a type
            that does not cast, a null in a non-nullable column, or a vector
            of the wrong length, NaN or infinity; the message names the column
            and, where it applies, the first offending row.
    """
    table = to_table(data)
    if table is None:
        return user_schema.empty_table()
    extra = [n for n in table.column_names if n not in user_schema.names]
    if extra:
        raise SchemaMismatchError(
            f"{uri}: column(s) {extra} are not in the table schema {user_schema.names}")
    cols = []
    for field in user_schema:
        if field.name not in table.column_names:
            if field.name == vector_column:
                # Checked here too: filled with nulls, the rows would fail later
                # (or worse) instead of naming the column.
                raise SchemaMismatchError(
                    f"{uri}: vector column {field.name!r} is missing; every row needs a vector")
            if not field.nullable:
                raise SchemaMismatchError(f"{uri}: non-nullable column {field.name!r} is missing")
            cols.append(pa.nulls(table.num_rows, field.type))
            continue
        col = table.column(field.name)
        if field.name == vector_column:
            col = _conform_vectors(uri, col, field)
        elif not col.type.equals(field.type):
            col = _cast(uri, col, field, "column", safe=True)
        if not field.nullable and col.null_count:
            raise SchemaMismatchError(
                f"{uri}: column {field.name!r} is not nullable but row {_first_null(col)} is null")
        cols.append(col)
    return pa.table(cols, schema=user_schema)


def _first_null(col) -> int:
    return pc.index(pc.is_null(col), True).as_py()


def _cast(uri: str, col, field: pa.Field, what: str, *, safe: bool):
    try:
        return col.cast(field.type, safe=safe)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaMismatchError(
            f"{uri}: {what} {field.name!r} has type {col.type}; the table wants "
            f"{field.type} ({exc})") from exc


def _conform_vectors(uri: str, col, field: pa.Field):
    dim = field.type.list_size
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if col.null_count:
        raise SchemaMismatchError(
            f"{uri}: vector column {field.name!r}: row {_first_null(col)} is null")
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or \
            pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        wrong = np.where(lengths != dim)[0]
        if len(wrong):
            raise SchemaMismatchError(
                f"{uri}: vector column {field.name!r}: row {int(wrong[0])} has "
                f"{int(lengths[wrong[0]])} values, the table's dimension is {dim}")
    # Unsafe: float64 vectors narrow to the table's float32 by design.
    col = _cast(uri, col, field, "vector column", safe=False)
    values = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
    # (NaN carries through min and max: two passes find every non-finite value.)
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        row = int(np.argmax(~np.isfinite(values)) // dim)
        raise SchemaMismatchError(
            f"{uri}: vector column {field.name!r}: row {row} holds NaN or infinity")
    row = overflowing_row(values.reshape(-1, dim), max(hi, -lo))
    if row is not None:
        raise SchemaMismatchError(
            f"{uri}: vector column {field.name!r}: row {row} {TOO_LARGE}")
    return col


# Every metric's distances (and the grid's training) square a vector's norm in
# float32; a quarter of float32's range leaves room to add two of them.
SQUARED_NORM_LIMIT = float(np.finfo(np.float32).max) / 4
TOO_LARGE = ("is too large: its squared norm overflows float32 distances "
             f"(keep it under {SQUARED_NORM_LIMIT:.2g})")


def overflowing_row(vectors: np.ndarray, largest: Optional[float] = None) -> Optional[int]:
    """The first of ``vectors`` (finite, ``[rows, dim]``) whose squared norm is
    past ``SQUARED_NORM_LIMIT``, or None; ``largest``: their largest magnitude."""
    if not vectors.size:
        return None
    if largest is None:
        largest = max(float(vectors.max()), -float(vectors.min()))
    if largest <= math.sqrt(SQUARED_NORM_LIMIT / vectors.shape[1]):
        return None   # (the common case, without squaring every value)
    with np.errstate(over="ignore"):   # (float64 values past 1e154 square to inf)
        over = np.flatnonzero(np.einsum("ij,ij->i", vectors, vectors) > SQUARED_NORM_LIMIT)
    return int(over[0]) if len(over) else None
