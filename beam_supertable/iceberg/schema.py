"""A table's Arrow schema as an Iceberg schema, and bounds in Iceberg's binary form.

Field ids are the table's (format/fields.py: recorded in its schema, given in
schema order, depth first, ``_id`` is 1). Superfiles carry them as Parquet
field ids; those written before ids were recorded carry none, and the name
mapping (``schema.name-mapping.default``) resolves their columns by the names
they were written with, the list elements of a vector column included.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Dict, List, Optional, Tuple

import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format import fields

__all__ = ["IcebergSchema", "iceberg_schema"]

_PRIMITIVES = (
    (pa.types.is_boolean, "boolean"),
    (lambda t: pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t)
     or pa.types.is_uint8(t) or pa.types.is_uint16(t), "int"),
    (pa.types.is_int64, "long"),
    (pa.types.is_float32, "float"),
    (pa.types.is_float64, "double"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), "binary"),
    (pa.types.is_date, "date"),
)


class IcebergSchema:
    """The Iceberg view of one Arrow schema.

    Attributes:
        json: the schema as Iceberg metadata writes it (``schema-id`` 0).
        name_mapping: ``schema.name-mapping.default``, as a list.
        last_column_id: the highest field id.
        top_level: ``{column: (field id, Iceberg type)}`` of the top-level
            columns; the type is None for nested ones (no bounds for them).
    """

    def __init__(self, schema: pa.Schema, properties: Optional[Dict[str, Any]] = None,
                 schema_id: int = 0) -> None:
        # The ids the table's schema records (format/fields.py); a schema
        # without them gets the ones this face has always given.
        schema = fields.with_ids(schema)
        props = properties or {}
        stamped = props.get(fields.NAME_MAPPING)
        legacy: Dict[int, List[str]] = {}
        for name, fid in (stamped or {}).items():
            legacy.setdefault(int(fid), []).append(name)
        self._next = 0
        nodes, mapping = [], []
        self.top_level: Dict[str, Tuple[int, Optional[str]]] = {}
        for field in schema:
            node, names = self._field(field)
            nodes.append(node)
            if stamped is not None:
                # Superfiles without ids hold the names of before the first schema
                # change: a column added since (a dropped name added again too)
                # is not in them.
                names["names"] = legacy.get(node["id"], [])
            if names["names"]:
                mapping.append(names)
            kind = node["type"] if isinstance(node["type"], str) else None
            self.top_level[field.name] = (node["id"], kind)
        self._by_id = {fid: kind for fid, kind in self.top_level.values()}
        self._legacy = {name: int(fid) for name, fid in (stamped or {}).items()}
        self.json = {"type": "struct", "schema-id": schema_id, "fields": nodes}
        self.name_mapping = mapping
        self.last_column_id = max(self._next, int(props.get(fields.LAST_COLUMN_ID) or 0))

    def _id(self, field: Optional[pa.Field] = None) -> int:
        found = fields.field_id(field) if field is not None else None
        if found is None:
            self._next += 1
            return self._next
        self._next = max(self._next, found)
        return found

    def _field(self, field: pa.Field) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        field_id = self._id(field)
        kind, nested = self._type(field.type, field.name)
        node = {"id": field_id, "name": field.name, "required": not field.nullable, "type": kind}
        names: Dict[str, Any] = {"field-id": field_id, "names": [field.name]}
        if nested:
            names["fields"] = nested
        return node, names

    def _type(self, arrow: pa.DataType, where: str) -> Tuple[Any, List[Dict[str, Any]]]:
        if pa.types.is_dictionary(arrow):
            arrow = arrow.value_type      # Parquet stores the values; readers decode them
        for test, name in _PRIMITIVES:
            if test(arrow):
                return name, []
        if pa.types.is_timestamp(arrow):
            # Iceberg v2 has microseconds only: nanosecond columns read as microseconds.
            return ("timestamptz" if arrow.tz else "timestamp"), []
        if pa.types.is_time64(arrow) and arrow.unit == "us":
            return "time", []
        if pa.types.is_decimal(arrow):
            return f"decimal({arrow.precision}, {arrow.scale})", []
        if pa.types.is_fixed_size_binary(arrow):
            return f"fixed[{arrow.byte_width}]", []
        if pa.types.is_list(arrow) or pa.types.is_large_list(arrow) \
                or pa.types.is_fixed_size_list(arrow):
            value = arrow.value_field
            element_id = self._id(value)
            kind, nested = self._type(value.type, f"{where}.{value.name}")
            names: Dict[str, Any] = {"field-id": element_id, "names": ["element"]}
            if nested:
                names["fields"] = nested
            return ({"type": "list", "element-id": element_id, "element": kind,
                     "element-required": not value.nullable}, [names])
        if pa.types.is_struct(arrow):
            children, mapping = [], []
            for child in arrow:
                node, names = self._field(child)
                children.append(node)
                mapping.append(names)
            return {"type": "struct", "fields": children}, mapping
        if pa.types.is_map(arrow):
            key_id, value_id = self._id(arrow.key_field), self._id(arrow.item_field)
            key, _ = self._type(arrow.key_type, f"{where}.key")
            value, value_nested = self._type(arrow.item_type, f"{where}.value")
            value_names: Dict[str, Any] = {"field-id": value_id, "names": ["value"]}
            if value_nested:
                value_names["fields"] = value_nested
            return ({"type": "map", "key-id": key_id, "key": key, "value-id": value_id,
                     "value": value, "value-required": not arrow.item_field.nullable},
                    [{"field-id": key_id, "names": ["key"]}, value_names])
        why = " (Iceberg has no unsigned integers)" if pa.types.is_unsigned_integer(arrow) else ""
        raise SchemaMismatchError(
            f"column {where!r}: Arrow type {arrow} has no Apache Iceberg type{why}; store it "
            "as another type, or create the table with iceberg=False")

    def columns_of(self, entry: Dict[str, Any]) -> Dict[str, Tuple[int, Optional[str]]]:
        """``{name in the entry's statistics: (field id, Iceberg type)}`` of the columns
        this schema still has: by the entry's field ids (renamed, dropped and added
        again since it was written), by the name mapping for an entry without them."""
        ids = entry.get("field_ids") or self._legacy
        if not ids:
            return self.top_level
        return {name: (fid, self._by_id[fid]) for name, fid in ids.items() if fid in self._by_id}

    def bounds(self, entry: Dict[str, Any]) -> Tuple[Dict[int, bytes], Dict[int, bytes]]:
        """A superfile entry's ``stats`` as Iceberg lower and upper bounds, by field id."""
        lower: Dict[int, bytes] = {}
        upper: Dict[int, bytes] = {}
        columns = self.columns_of(entry)
        for column, pair in (entry.get("stats") or {}).items():
            field_id, kind = columns.get(column, (None, None))
            if kind is None or not isinstance(pair, (list, tuple)) or len(pair) != 2:
                continue
            lo, hi = (_encode(kind, pair[0], upper=False), _encode(kind, pair[1], upper=True))
            if lo is not None:
                lower[field_id] = lo
            if hi is not None:
                upper[field_id] = hi
        return lower, upper


def _encode(kind: str, value: Any, *, upper: bool) -> Optional[bytes]:
    """Iceberg's single-value binary form, or None when the bound cannot be stated.

    Bounds in the entries are as stored (see the format specification):
    timestamps and dates in nanoseconds, strings possibly cut; a cut bound
    is still a valid Iceberg bound (a prefix below, its successor above).
    """
    if value is None or isinstance(value, bool) and kind not in ("boolean",):
        return None
    try:
        if kind == "boolean":
            return b"\x01" if value else b"\x00"
        if kind == "int":
            return struct.pack("<i", int(value))
        if kind == "long":
            return struct.pack("<q", int(value))
        if kind in ("float", "double"):
            number = float(value)
            if not math.isfinite(number):
                return None
            return struct.pack("<f" if kind == "float" else "<d", number)
        if kind == "string":
            return str(value).encode("utf-8")
        if kind == "date":
            days, rest = divmod(int(value), 86_400_000_000_000)
            return struct.pack("<i", days + (1 if upper and rest else 0))
        if kind in ("timestamp", "timestamptz"):
            micros, rest = divmod(int(value), 1000)
            return struct.pack("<q", micros + (1 if upper and rest else 0))
        if kind in ("timestamp_ns", "timestamptz_ns"):
            return struct.pack("<q", int(value))
    except (TypeError, ValueError, OverflowError, struct.error):
        return None
    return None


def iceberg_schema(schema: pa.Schema, properties: Optional[Dict[str, Any]] = None,
                   schema_id: int = 0) -> IcebergSchema:
    """The Iceberg view of ``schema`` (see :class:`IcebergSchema`); ``properties``
    (the table's) give its last column id and the name mapping of old superfiles."""
    return IcebergSchema(schema, properties, schema_id)
