"""``schema_mode="merge"`` in the Beam writers: columns the table lacks are added.

A worker that meets a row with a column the table lacks adds it (one schema
commit through the table: workers racing to add the same column agree on
the version that lands first; another type for it is refused, naming the
column) and conforms its rows to the table's schema from then on. Table
columns a row lacks are null, as in strict mode.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional

import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.schema import to_table
from beam_supertable.table import evolve
from beam_supertable.table.supertable import Supertable

__all__ = ["SCHEMA_MODES", "check_schema_mode", "concat_conformed", "widen_for"]

SCHEMA_MODES = evolve.SCHEMA_MODES


def check_schema_mode(where: str, schema_mode: Any) -> str:
    if schema_mode not in SCHEMA_MODES:
        raise ValueError(f"{where}: schema_mode must be one of {list(SCHEMA_MODES)}, "
                         f"got {schema_mode!r}")
    return schema_mode


def _extra_columns(elements: Iterable[Any], names: frozenset) -> Optional[pa.Table]:
    """The values of the columns not in ``names`` (types inferred), or None."""
    dict_rows: List[dict] = []
    parts: List[pa.Table] = []
    for element in elements:
        if isinstance(element, (pa.RecordBatch, pa.Table)):
            extra = [n for n in element.schema.names if n not in names]
            if extra:
                parts.append(pa.table([element.column(n) for n in extra], names=extra))
        elif isinstance(element, dict):
            extra = {k: v for k, v in element.items() if k not in names}
            if extra:
                dict_rows.append(extra)
    if dict_rows:
        keys = list(dict.fromkeys(k for row in dict_rows for k in row))
        try:
            parts.append(pa.Table.from_pydict({k: [r.get(k) for r in dict_rows] for k in keys}))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise SchemaMismatchError(f"new column(s) {keys}: the rows give them no one "
                                      f"type: {exc}") from exc
    if not parts:
        return None
    fields = {}
    for part in parts:
        for f in part.schema:
            if f.name not in fields or pa.types.is_null(fields[f.name].type):
                fields[f.name] = f
    return pa.schema(list(fields.values())).empty_table()


def widen_for(open_table: Callable[[], Supertable], elements: Iterable[Any],
              names: frozenset) -> Optional[Supertable]:
    """Adds the columns of ``elements`` (dict rows or Arrow batches) not in
    ``names`` to the table; the table at the version holding them, or None
    when there were none."""
    extra = _extra_columns(elements, names)
    if extra is None:
        return None
    table = open_table()
    # Only rows that fit the widened schema bring columns: a row the writer
    # then refuses (a dead letter) adds nothing to the table.
    target = {f.name: f for f in list(table.user_schema) + list(extra.schema)}
    extra = _extra_columns([e for e in elements if _brings(e, names) and _fits(e, target)],
                           names)
    if extra is None:
        return None
    evolve.merge_input(table, extra)
    return table


def _brings(element: Any, names: frozenset) -> bool:
    """Whether ``element`` has a column not in ``names``."""
    if isinstance(element, (pa.RecordBatch, pa.Table)):
        return not names.issuperset(element.schema.names)
    return isinstance(element, dict) and not names.issuperset(element)


def _fits(element: Any, target: dict) -> bool:
    """Whether each column of ``element`` casts to its type in ``target``."""
    try:
        rows = to_table([element] if isinstance(element, dict) else element)
        if rows is None:
            return False
        for name in rows.column_names:
            field = target.get(name)
            if field is None or pa.types.is_fixed_size_list(field.type):
                continue   # a vector is checked by the writer; it brings no column
            col = rows.column(name)
            if not col.type.equals(field.type):
                col = col.cast(field.type, safe=True)
            if not field.nullable and col.null_count:
                return False
        return True
    except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, OverflowError):
        return False


def concat_conformed(tables: List[pa.Table], open_table: Callable[[], Supertable],
                     vector: Optional[str]) -> pa.Table:
    """Conformed tables as one; those conformed before a column was added get it (null)."""
    first = tables[0].schema
    if all(t.schema.equals(first) for t in tables[1:]):
        return pa.concat_tables(tables)
    from beam_supertable.format.schema import conform
    handle = open_table()
    return pa.concat_tables([conform(handle.uri, t, handle.user_schema, vector) for t in tables])
