"""Beam Rows and Arrow: a Beam schema as a table schema, table columns as a Beam schema.

Beam YAML carries schema'd PCollections: each element a ``beam.Row`` (or the
named tuple Beam makes of a schema) whose field types the pipeline knows
while it is built. A new table takes its columns from those types; a read
gives Rows typed from the table's columns. The mapping is deliberately small
(what a table holds and a Beam schema can say):

=================================  ======================================
Beam field type                    table column
=================================  ======================================
``int`` (INT64), ``numpy.int32``   ``int64``, ``int32``
``float`` (DOUBLE), ``float32``    ``float64``, ``float32``
``str``, ``bool``, ``bytes``       ``string``, ``bool``, ``binary``
``Timestamp``                      ``timestamp[us, UTC]``
``datetime.date``                  ``date32``
a list of T                        ``list<T>``; the vector column:
                                   ``fixed_size_list<float32>[vector_dim]``
=================================  ======================================

Every column read back is nullable (``Optional``). Beam schemas refuse field
names that start with ``_``, so the table's own ``_id`` is never a field.
"""

import collections.abc
import datetime
import typing
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
from apache_beam.typehints import schemas
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.utils.timestamp import Timestamp

__all__ = ["arrow_schema", "beam_fields", "input_fields", "row_type", "to_beam", "to_dict"]

_ATOMIC = {
    int: pa.int64(), np.int64: pa.int64(), np.int32: pa.int32(), np.int16: pa.int16(),
    np.int8: pa.int8(), np.uint8: pa.uint8(), float: pa.float64(), np.float64: pa.float64(),
    np.float32: pa.float32(), str: pa.string(), bool: pa.bool_(), bytes: pa.binary(),
    Timestamp: pa.timestamp("us", tz="UTC"), datetime.date: pa.date32(),
}
_LISTS = (list, tuple, collections.abc.Sequence, collections.abc.Iterable,
          collections.abc.Collection, typing.List, typing.Sequence, typing.Iterable)


def input_fields(element_type: Any, where: str) -> List[Tuple[str, Any]]:
    """``[(name, python type)]`` of a schema'd PCollection's elements."""
    try:
        return list(schemas.named_fields_from_element_type(element_type))
    except (TypeError, ValueError, KeyError) as exc:
        raise TypeError(f"{where}: the input has no Beam schema ({element_type}); give it one "
                        "(Create with rows, MapToFields, or a schema'd source)") from exc


def _optional(t: Any) -> Any:
    """``T`` of ``Optional[T]``; ``t`` otherwise."""
    if typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return t


def _arrow_type(where: str, name: str, t: Any) -> pa.DataType:
    t = _optional(t)
    if t in _ATOMIC:
        return _ATOMIC[t]
    origin = typing.get_origin(t)
    if origin in _LISTS or t in _LISTS:
        args = typing.get_args(t)
        if len(args) != 1:
            raise TypeError(f"{where}: field {name!r} is a list of unknown items ({t})")
        return pa.list_(_arrow_type(where, name, args[0]))
    raise TypeError(f"{where}: field {name!r} has type {t}, which a table column cannot hold; "
                    "supported: int, float, str, bool, bytes, timestamps, dates and lists of them")


def arrow_schema(where: str, fields: Sequence[Tuple[str, Any]], *,
                 vector_column: Optional[str] = None,
                 vector_dim: Optional[int] = None) -> pa.Schema:
    """A table schema of Beam fields; the vector column a fixed-size float32 list."""
    out = []
    for name, t in fields:
        if name == vector_column:
            item = _arrow_type(where, name, t)
            if not (pa.types.is_list(item) and (pa.types.is_floating(item.value_type)
                                                or pa.types.is_integer(item.value_type))):
                raise TypeError(f"{where}: vector column {name!r} must be a list of numbers, "
                                f"got {_optional(t)}")
            if vector_dim is None:
                raise ValueError(
                    f"{where}: creating a table with vector column {name!r} needs the vectors' "
                    "length, which a Beam schema does not carry: add vector_dim: N")
            if isinstance(vector_dim, bool) or not isinstance(vector_dim, int) or vector_dim < 1:
                raise ValueError(f"{where}: vector_dim must be a positive int, got "
                                 f"{vector_dim!r}")
            out.append(pa.field(name, pa.list_(pa.float32(), vector_dim)))
        else:
            out.append(pa.field(name, _arrow_type(where, name, t)))
    return pa.schema(out)


def _beam_type(where: str, field: pa.Field) -> Any:
    t = field.type
    if pa.types.is_integer(t):
        return int
    if pa.types.is_floating(t):
        return float
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str
    if pa.types.is_boolean(t):
        return bool
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes
    if pa.types.is_timestamp(t):
        return Timestamp
    if pa.types.is_date(t):
        return datetime.date   # Beam's date logical type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return typing.Sequence[Optional[_beam_type(where, t.value_field)]]
    raise TypeError(f"{where}: column {field.name!r} has type {t}, which this transform cannot "
                    "give as a Beam field; leave it out with columns: [...]")


def beam_fields(where: str, schema: pa.Schema) -> List[Tuple[str, Any]]:
    """``[(name, Optional[python type])]`` of table columns, for a Beam schema."""
    hidden = [f.name for f in schema if f.name.startswith("_")]
    if hidden:
        raise ValueError(f"{where}: column(s) {hidden} cannot be Beam fields (a Beam schema "
                         "refuses names that start with '_'); leave them out of columns")
    return [(f.name, Optional[_beam_type(where, f)]) for f in schema]


def row_type(fields: Sequence[Tuple[str, Any]]) -> RowTypeConstraint:
    return RowTypeConstraint.from_fields(list(fields))


def _to_python(value: Any) -> Any:
    if isinstance(value, Timestamp):
        return value.to_utc_datetime(has_tz=True)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_to_python(v) for v in value]
    return value


def to_dict(row: Any) -> Dict[str, Any]:
    """A Beam Row (or schema'd named tuple) as a dict of plain Python values."""
    as_dict = getattr(row, "_asdict", None) or getattr(row, "as_dict", None)
    if as_dict is None:
        raise TypeError(f"expected a Beam Row, got {type(row).__name__}")
    return {k: _to_python(v) for k, v in as_dict().items()}


def _to_beam(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        # pyarrow gives zoneinfo's UTC (or the column's own zone), which
        # Timestamp.from_utc_datetime refuses: the same instant in timezone.utc.
        return Timestamp.from_utc_datetime(value.astimezone(datetime.timezone.utc))
    if isinstance(value, (list, tuple)):
        return [_to_beam(v) for v in value]
    return value


def to_beam(values: Dict[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """Table values (as ``to_pylist`` gives them) for the Beam fields ``names``."""
    return {n: _to_beam(values.get(n)) for n in names}


def from_dict(values: Dict[str, Any]) -> Any:
    """``to_dict``'s inverse: a Beam Row again, its timestamps Beam ``Timestamp`` s."""
    import apache_beam as beam
    return beam.Row(**to_beam(values, list(values)))
