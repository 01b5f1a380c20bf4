"""Field ids: every column of a table has one, and reads resolve superfiles by it.

A table's schema carries each field's id as the Arrow field metadata
``PARQUET:field_id`` (nested fields too: list elements, map keys and values,
struct children), so superfiles written from it carry the ids in their
Parquet schema. Ids are given depth first in schema order (``_id`` is 1), the
order the Iceberg face has always used, so a table created before ids were
recorded gets exactly the ids its Iceberg metadata already published. A new
column takes the next id after the table's ``last_column_id`` (a property);
an id is never given twice, so a column dropped and added again under the
same name is a new column whose old values never come back.

Superfiles written before ids were recorded carry none: their columns are
resolved through the table's name mapping (the property ``name_mapping``,
``{name at the time: field id}``, stamped by the first schema change).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError

__all__ = ["FIELD_ID", "LAST_COLUMN_ID", "NAME_MAPPING", "Resolution", "SCHEMA_HISTORY",
           "assign_ids", "describe",
           "field_id", "last_column_id", "name_mapping", "resolve", "strip_ids", "with_ids",
           "without_ids"]

FIELD_ID = b"PARQUET:field_id"
LAST_COLUMN_ID = "last_column_id"
NAME_MAPPING = "name_mapping"
MAPPING_KEY = b"supertable.name_mapping"
SCHEMA_HISTORY = "schema_history"   # [{"version", "change"}] of every schema change


def describe(schema: pa.Schema) -> list:
    """``[{"name", "id", "type"}]`` of the schema's columns (JSON data)."""
    return [{"name": f.name, "id": field_id(f), "type": str(strip_ids(f.type))} for f in schema]


def field_id(field: pa.Field) -> Optional[int]:
    """The field's id, or None when it has none."""
    meta = field.metadata
    if not meta or FIELD_ID not in meta:
        return None
    return int(meta[FIELD_ID])


def _with_id(field: pa.Field, fid: int) -> pa.Field:
    meta = dict(field.metadata or {})
    meta[FIELD_ID] = str(fid).encode()
    return field.with_metadata(meta)


class _Counter:
    def __init__(self, last: int) -> None:
        self.last = last

    def take(self, field: pa.Field) -> int:
        found = field_id(field)
        if found is not None:
            self.last = max(self.last, found)
            return found
        self.last += 1
        return self.last


def _field(field: pa.Field, counter: _Counter) -> pa.Field:
    fid = counter.take(field)
    return _with_id(field.with_type(_type(field.type, counter)), fid)


def _type(arrow: pa.DataType, counter: _Counter) -> pa.DataType:
    # The Iceberg face's order (iceberg/schema.py): a list's element id, then
    # what is inside it; a map's key and value ids, then what is inside them.
    if pa.types.is_fixed_size_list(arrow):
        return pa.list_(_field(arrow.value_field, counter), arrow.list_size)
    if pa.types.is_large_list(arrow):
        return pa.large_list(_field(arrow.value_field, counter))
    if pa.types.is_list(arrow):
        return pa.list_(_field(arrow.value_field, counter))
    if pa.types.is_struct(arrow):
        return pa.struct([_field(child, counter) for child in arrow])
    if pa.types.is_map(arrow):
        key_id, item_id = counter.take(arrow.key_field), counter.take(arrow.item_field)
        key = arrow.key_field.with_type(_type(arrow.key_type, counter))
        item = arrow.item_field.with_type(_type(arrow.item_type, counter))
        return pa.map_(_with_id(key, key_id), _with_id(item, item_id), arrow.keys_sorted)
    return arrow


def has_ids(schema: pa.Schema) -> bool:
    return all(field_id(f) is not None for f in schema)


def assign_ids(schema: pa.Schema, last_id: int = 0) -> Tuple[pa.Schema, int]:
    """``schema`` with an id on every field that has none; and the highest id.

    Fields holding an id keep it; the others take ids after ``last_id`` (and
    after every id met before them), depth first in schema order.
    """
    counter = _Counter(last_id)
    out = [_field(f, counter) for f in schema]
    return pa.schema(out, metadata=schema.metadata), counter.last


def with_ids(schema: pa.Schema) -> pa.Schema:
    """``schema`` with ids (those it holds, the others given as the Iceberg face did)."""
    if has_ids(schema) and all(_nested_have_ids(f.type) for f in schema):
        return schema
    return assign_ids(schema)[0]


def _nested_have_ids(arrow: pa.DataType) -> bool:
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow) \
            or pa.types.is_fixed_size_list(arrow):
        children = [arrow.value_field]
    elif pa.types.is_struct(arrow):
        children = list(arrow)
    elif pa.types.is_map(arrow):
        children = [arrow.key_field, arrow.item_field]
    else:
        return True
    return all(field_id(c) is not None and _nested_have_ids(c.type) for c in children)


def max_id(schema: pa.Schema) -> int:
    return assign_ids(schema)[1]


def last_column_id(schema: pa.Schema, properties: Mapping[str, Any]) -> int:
    """The highest id ever given in the table (a dropped column's included)."""
    return max(int(properties.get(LAST_COLUMN_ID) or 0), max_id(schema))


def name_mapping(schema: pa.Schema, properties: Mapping[str, Any]) -> Dict[str, int]:
    """How superfiles without ids name their columns: ``{name: field id}``."""
    stamped = properties.get(NAME_MAPPING)
    if stamped is not None:
        return {str(k): int(v) for k, v in stamped.items()}
    return {f.name: field_id(f) for f in schema}


def without_ids(field: pa.Field) -> pa.Field:
    """``field`` with no field ids, its children's included."""
    meta = {k: v for k, v in (field.metadata or {}).items() if k != FIELD_ID}
    return field.with_type(strip_ids(field.type)).with_metadata(meta or None)


def with_name_mapping(schema: pa.Schema, mapping: Mapping[str, int]) -> pa.Schema:
    """``schema`` carrying the name mapping in its metadata too (filters read it there)."""
    meta = dict(schema.metadata or {})
    meta[MAPPING_KEY] = json.dumps(dict(mapping), sort_keys=True).encode()
    return schema.with_metadata(meta)


def schema_mapping(schema: pa.Schema) -> Optional[Dict[str, int]]:
    """The name mapping ``with_name_mapping`` put in ``schema``, or None."""
    found = (schema.metadata or {}).get(MAPPING_KEY)
    return None if found is None else {str(k): int(v) for k, v in json.loads(found).items()}


def strip_ids(arrow: pa.DataType) -> pa.DataType:
    """``arrow`` without field ids on its children."""
    if pa.types.is_fixed_size_list(arrow):
        return pa.list_(without_ids(arrow.value_field), arrow.list_size)
    if pa.types.is_large_list(arrow):
        return pa.large_list(without_ids(arrow.value_field))
    if pa.types.is_list(arrow):
        return pa.list_(without_ids(arrow.value_field))
    if pa.types.is_struct(arrow):
        return pa.struct([without_ids(c) for c in arrow])
    if pa.types.is_map(arrow):
        return pa.map_(without_ids(arrow.key_field), without_ids(arrow.item_field),
                       arrow.keys_sorted)
    return arrow


# -- resolving a superfile's columns ------------------------------------------
class Resolution:
    """A table schema and its name mapping, the key to resolve superfiles against."""

    def __init__(self, schema: pa.Schema, mapping: Mapping[str, int]) -> None:
        self.schema = schema
        self.mapping = dict(mapping)
        self.key = (tuple((f.name, field_id(f), str(f.type)) for f in schema),
                    tuple(sorted(self.mapping.items())))


class _Plan:
    def __init__(self, file_schema: pa.Schema, res: Resolution) -> None:
        by_id: Dict[int, pa.Field] = {}
        for f in file_schema:
            fid = field_id(f)
            if fid is None:
                fid = res.mapping.get(f.name)
            if fid is not None:
                by_id[fid] = f
        self.source: Dict[str, Optional[pa.Field]] = {}
        self.target: Dict[str, pa.Field] = {}
        identity = len(file_schema) == len(res.schema)
        for f in res.schema:
            src = by_id.get(field_id(f)) if field_id(f) is not None else (
                file_schema.field(f.name) if f.name in file_schema.names else None)
            self.source[f.name] = src
            self.target[f.name] = f
            if src is None or src.name != f.name or not src.type.equals(f.type):
                identity = False
        self.identity = identity
        self.schema_metadata = file_schema.metadata


def resolve(reader, res: Resolution):
    """``reader`` (a ``SuperfileReader``) seen through the table schema of ``res``.

    The reader itself when the superfile's columns are the table's; else a
    view whose ``read``/``take``/``take_kept``/``arrow_schema`` give the table's
    columns: found by field id (by the name mapping for a superfile without
    ids), renamed, widened, and null where the superfile lacks the field;
    columns dropped from the table are not read.
    """
    plans = reader.__dict__.setdefault("_resolutions", {})
    plan = plans.get(res.key)
    if plan is None:
        plan = plans[res.key] = _Plan(reader.arrow_schema, res)
    return reader if plan.identity else ResolvedReader(reader, plan)


def _cast(col, target: pa.Field, name: str):
    """A column seen under another type; a value the type cannot hold (read
    across a restore that narrowed the column) is refused naming the column."""
    try:
        return col.cast(target.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaMismatchError(
            f"column {name!r}: a value held as {col.type} does not fit {target.type} "
            f"({str(exc).splitlines()[0]})") from None


class ResolvedReader:
    """A superfile reader that speaks the table's current schema (see ``resolve``)."""

    def __init__(self, reader, plan: _Plan) -> None:
        self._reader = reader
        self._plan = plan

    def __getattr__(self, name: str):
        return getattr(self._reader, name)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(list(self._plan.target.values()))

    def _names(self, columns: Optional[Sequence[str]]) -> List[str]:
        names = list(columns) if columns is not None else list(self._plan.target)
        unknown = [c for c in names if c not in self._plan.target]
        if unknown:
            raise KeyError(f"column(s) {unknown} are not in the table schema")
        return names

    def _file_columns(self, names: Sequence[str]) -> List[str]:
        cols = list(dict.fromkeys(self._plan.source[c].name for c in names
                                  if self._plan.source[c] is not None))
        return cols or ["_id"]    # a read of only new columns still needs the row count

    def _shape(self, table: pa.Table, names: Sequence[str]) -> pa.Table:
        arrays, fields = [], []
        for c in names:
            src, target = self._plan.source[c], self._plan.target[c]
            if src is None:
                col = pa.nulls(table.num_rows, target.type)
            else:
                col = table.column(src.name)
                if not col.type.equals(target.type):
                    col = _cast(col, target, c)
            arrays.append(col)
            fields.append(target)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))

    def read(self, columns: Optional[Sequence[str]] = None) -> pa.Table:
        names = self._names(columns)
        return self._shape(self._reader.read(self._file_columns(names)), names)

    def take(self, rows: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        names = self._names(columns)
        return self._shape(self._reader.take(rows, self._file_columns(names)), names)

    def take_kept(self, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
        names = self._names(columns)
        return self._shape(self._reader.take_kept(rows, self._file_columns(names)), names)
