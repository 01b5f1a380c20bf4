"""Schema changes: add, drop, rename and widen columns, each one metadata-only commit.

A change writes no data: it commits a new schema (see ``format/fields.py``:
every column keeps its field id, a new column takes a new one) and reads
resolve every superfile against the schema of the version they read. The
change is computed again on the version the commit lands on (a lost race
re-validates it there), so two writers adding the same column agree and
one adding a column another just dropped fails naming it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format import fields
from beam_supertable.format.manifest import DEFAULT_MAX_RETRIES, CommitRequest, Snapshot
from beam_supertable.format.keys import KeyBatch
from beam_supertable.format.schema import ID, conform, to_table
from beam_supertable.iceberg import metadata as iceberg_meta
from beam_supertable.table.mutation import Mutation

Supertable = Any   # the handle (table/supertable.py imports this module)

__all__ = ["add_columns", "alter_column", "as_fields", "drop_columns", "missing_columns",
           "rename_column", "widens"]

Change = Callable[[Snapshot], Optional[Tuple[pa.Schema, str]]]

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether ``old`` widens to ``new`` without losing a value."""
    if old in _INTS and new in _INTS:
        return _INTS.index(new) > _INTS.index(old)
    if pa.types.is_float32(old) and pa.types.is_float64(new):
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return (old.scale == new.scale and new.precision > old.precision
                and old.bit_width <= new.bit_width)
    return pa.types.is_string(old) and pa.types.is_large_string(new)


def as_fields(given: Union[pa.Field, pa.Schema, Sequence[pa.Field]]) -> List[pa.Field]:
    if isinstance(given, pa.Field):
        return [given]
    if isinstance(given, (str, bytes, dict)) or not hasattr(given, "__iter__"):
        raise TypeError(f"add_columns takes a pyarrow Field, a list of them or a Schema, "
                        f"got {type(given).__name__}")
    out = list(given)
    bad = [type(f).__name__ for f in out if not isinstance(f, pa.Field)]
    if bad:
        raise TypeError(f"add_columns takes a pyarrow Field, a list of them or a Schema, "
                        f"got {bad[0]}")
    return out


def _protected(snapshot: Snapshot) -> Dict[str, str]:
    """Columns no schema change may touch, with why."""
    props = snapshot.properties
    out = {ID: "the row id"}
    for c in props.get("primary_key") or ():
        out[c] = "a primary-key column"
    if props.get("vector"):
        out[props["vector"]["column"]] = "the vector index column"
    for c in (props.get("fts") or {}).get("columns", ()):
        out[c] = "a text index column"
    return out


def _column(uri: str, schema: pa.Schema, name: str, snapshot: Snapshot, verb: str) -> pa.Field:
    if not isinstance(name, str):
        raise TypeError(f"{verb}: a column name is a str, got {type(name).__name__}")
    if name not in schema.names:
        raise SchemaMismatchError(
            f"{uri}: {verb}: column {name!r} is not in the table schema "
            f"{[n for n in schema.names if n != ID]} (version {snapshot.version})")
    why = _protected(snapshot).get(name)
    if why is not None:
        raise SchemaMismatchError(f"{uri}: {verb}: column {name!r} is {why}; it cannot change")
    return schema.field(name)


def _commit(table: Supertable, operation: str, change: Change, max_retries: int) -> int:
    """Commits the schema ``change`` computes on each base; the version it landed in
    (the latest one when, on the base it met, nothing was left to change)."""
    first = change(table.snapshot)    # refuses bad input before anything is committed
    if first is None:
        return table.version

    def rebuild(base: Snapshot) -> Optional[CommitRequest]:
        found = change(base)
        if found is None:
            return None
        schema, what = found
        props: Dict[str, Any] = {fields.LAST_COLUMN_ID: fields.last_column_id(
            schema, {fields.LAST_COLUMN_ID: fields.last_column_id(base.schema, base.properties)})}
        # What each change was, for inspect (small: one line per change).
        props[fields.SCHEMA_HISTORY] = list(base.properties.get(fields.SCHEMA_HISTORY) or []) \
            + [{"version": base.version + 1, "change": what}]
        mapping = base.properties.get(fields.NAME_MAPPING)
        if mapping is None:
            # Superfiles written before this first change hold these names.
            mapping = props[fields.NAME_MAPPING] = fields.name_mapping(base.schema, {})
        schema = fields.with_name_mapping(schema, mapping)
        return CommitRequest(operation=operation, schema=schema, allow_schema_change=True,
                             set_properties=props, replace_properties=tuple(props),
                             metadata={"schema_change": what}, base_version=base.version)

    return table.commit(rebuild(table.snapshot), rebuild=rebuild, max_retries=max_retries)


def _new_schema(base: Snapshot, fields_out: List[pa.Field], added: bool) -> pa.Schema:
    schema = pa.schema(fields_out, metadata=base.schema.metadata)
    if added:
        schema = fields.assign_ids(schema, fields.last_column_id(base.schema, base.properties))[0]
    return schema


def _iceberg_check(uri: str, base: Snapshot, schema: pa.Schema) -> None:
    if iceberg_meta.is_enabled(base):
        iceberg_meta.check_schema(uri, schema)


def missing_columns(table: Supertable, given, *, existing_ok: bool) -> Change:
    """The change adding ``given`` fields; with ``existing_ok`` a field the base
    already holds with the same type is left alone (merge-mode writers)."""
    new = [fields.without_ids(f) for f in as_fields(given)]
    uri = table.uri
    seen = set()
    for f in new:
        if f.name in seen:
            raise SchemaMismatchError(f"{uri}: add_columns: column {f.name!r} is given twice")
        seen.add(f.name)
        if f.name == ID or f.name.startswith("_"):
            raise SchemaMismatchError(
                f"{uri}: add_columns: column {f.name!r}: names starting with '_' are reserved")
        if not f.nullable:
            raise SchemaMismatchError(
                f"{uri}: add_columns: column {f.name!r} must be nullable (existing rows read "
                "null in it)")

    def change(base: Snapshot):
        schema = base.schema
        adding = []
        for f in new:
            if f.name in schema.names:
                held = schema.field(f.name).type
                if existing_ok and fields.strip_ids(held).equals(fields.strip_ids(f.type)):
                    continue
                if existing_ok:
                    raise SchemaMismatchError(
                        f"{uri}: column {f.name!r} is {held} in the table (version "
                        f"{base.version}) but {f.type} in the rows written")
                raise SchemaMismatchError(
                    f"{uri}: add_columns: column {f.name!r} is already in the table "
                    f"(version {base.version})")
            adding.append(f)
        if not adding:
            return None
        out = _new_schema(base, list(schema) + adding, True)
        _iceberg_check(uri, base, out)
        return out, "add " + ", ".join(f"{f.name} {f.type}" for f in adding)

    return change


def add_columns(table: Supertable, given, *, max_retries: int = DEFAULT_MAX_RETRIES) -> int:
    return _commit(table, "add_columns", missing_columns(table, given, existing_ok=False),
                   max_retries)


def drop_columns(table: Supertable, names: Union[str, Sequence[str]], *,
                 max_retries: int = DEFAULT_MAX_RETRIES) -> int:
    wanted = [names] if isinstance(names, str) else \
        list(names) if isinstance(names, (list, tuple, set, frozenset)) else None
    if wanted is None or not all(isinstance(n, str) for n in wanted):
        raise TypeError(f"{table.uri}: drop_columns takes a column name or a list of names, "
                        f"got {names!r}")
    if not wanted:
        raise ValueError(f"{table.uri}: drop_columns: no column named")
    twice = [n for n in dict.fromkeys(wanted) if wanted.count(n) > 1]
    if twice:
        raise SchemaMismatchError(f"{table.uri}: drop_columns: column {twice[0]!r} is given "
                                  "twice")

    def change(base: Snapshot):
        for name in wanted:
            _column(table.uri, base.schema, name, base, "drop_columns")
        out = _new_schema(base, [f for f in base.schema if f.name not in wanted], False)
        return out, "drop " + ", ".join(wanted)

    return _commit(table, "drop_columns", change, max_retries)


def rename_column(table: Supertable, old: str, new: str, *,
                  max_retries: int = DEFAULT_MAX_RETRIES) -> int:
    if not isinstance(new, str) or not new or new.startswith("_"):
        raise SchemaMismatchError(
            f"{table.uri}: rename_column: {new!r} is not a column name (a non-empty str not "
            "starting with '_')")

    def change(base: Snapshot):
        _column(table.uri, base.schema, old, base, "rename_column")
        if new in base.schema.names:
            raise SchemaMismatchError(
                f"{table.uri}: rename_column: column {new!r} is already in the table "
                f"(version {base.version})")
        out = _new_schema(base, [f.with_name(new) if f.name == old else f
                                 for f in base.schema], False)
        return out, f"rename {old} to {new}"

    return _commit(table, "rename_column", change, max_retries)


def alter_column(table: Supertable, name: str, new_type: pa.DataType, *,
                 max_retries: int = DEFAULT_MAX_RETRIES) -> int:
    if not isinstance(new_type, pa.DataType):
        raise TypeError(f"{table.uri}: alter_column: column {name!r}: the type is a pyarrow "
                        f"DataType such as pa.int64(), got {new_type!r}")

    def change(base: Snapshot):
        field = _column(table.uri, base.schema, name, base, "alter_column")
        if field.type.equals(new_type):
            return None
        if not widens(field.type, new_type):
            raise SchemaMismatchError(
                f"{table.uri}: alter_column: column {name!r} is {field.type}; {new_type} is "
                "not a widening of it (int8→int16→int32→int64, float32→float64, a decimal's "
                "precision up, string→large_string)")
        out = _new_schema(base, [f.with_type(new_type) if f.name == name else f
                                 for f in base.schema], False)
        _iceberg_check(table.uri, base, out)
        return out, f"alter {name} to {new_type}"

    return _commit(table, "alter_column", change, max_retries)


SCHEMA_MODES = ("strict", "merge")


def check_schema_mode(schema_mode: str) -> str:
    if schema_mode not in SCHEMA_MODES:
        raise ValueError(f"schema_mode must be one of {list(SCHEMA_MODES)}, got {schema_mode!r}")
    return schema_mode


def merge_input(table: Supertable, data, *, max_retries: int = DEFAULT_MAX_RETRIES,
                operation: Optional[str] = None, token: Optional[str] = None):
    """``schema_mode="merge"``: adds the columns of ``data`` the table lacks (one
    schema commit; the handle moves to it) and returns ``data`` as an Arrow table.

    With ``operation`` (``"append"``, ``"upsert"``: ``data`` is the whole write),
    the rows are first checked against the schema they will meet (types, nulls,
    vectors, a key given twice), so a write refused for its rows adds no column.

    Raises:
        SchemaMismatchError: a new column holding only nulls (no type to give it),
            or one another writer added meanwhile with another type.
    """
    rows = to_table(data)
    if rows is None:
        return data
    names = table.schema.names
    extra = [f for f in rows.schema if f.name not in names]
    if not extra:
        return rows
    for f in extra:
        if pa.types.is_null(f.type):
            raise SchemaMismatchError(
                f"{table.uri}: column {f.name!r} holds only nulls: its type cannot be inferred; "
                "add it first with add_columns")
    new = [pa.field(f.name, f.type, nullable=True) for f in extra]
    if operation is not None:
        _check_rows(table, rows, new, operation, token)
    _commit(table, "add_columns", missing_columns(table, new, existing_ok=True), max_retries)
    return rows


def _check_rows(table: Supertable, rows: pa.Table, new: List[pa.Field], operation: str,
                token: Optional[str]) -> None:
    """Refuses rows the write would refuse once ``new`` columns are added (an
    append's keys already live too, as the append itself checks them)."""
    vp = table.properties.get("vector")
    target = pa.schema(list(table.user_schema) + new)
    conformed = conform(table.uri, rows, target, vp["column"] if vp else None)
    if table.primary_key:
        keys = KeyBatch(conformed, table.primary_key)
        keys.check_unique(table.uri, operation)
        if operation == "append" and token is None and len(keys):
            Mutation(table, operation, keys=keys, refuse_live=True,
                     base_version=table.version).request(table.snapshot)
