"""``update(where, values)`` and ``restore(version)``: rewrites as one commit.

Both are planned writes (``merge_insert.run_planned``): the rows they
replace are found on the latest version, their new rows uploaded, and the
commit re-plans on every base it tries; a concurrent commit that changes
the rows to rewrite makes the write start again on the newer version.

``update`` replaces each live row matching ``where`` by the row with
``values`` applied (scalars, or pyarrow expressions over the row's own
columns, evaluated on the old row). The new rows are written like any
other (a new ``_id``; a vector re-assigned to its cell, text re-indexed),
so the change feed shows an update as a retraction and an insertion.

``restore(version)`` commits a new version whose rows equal ``version`` 's:
rows live in both stay untouched (same ``_id``), rows only live now are
deleted, rows only live then are written again. History, tokens and
consumers stay: it is a commit, not a rewind. When the old version had
another schema, it comes back with its rows (every row is written again
under it).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from beam_supertable.errors import SchemaMismatchError, VersionNotFoundError
from beam_supertable.format import fields
from beam_supertable.format.filters import mask, pruned
from beam_supertable.format.manifest import DEFAULT_MAX_RETRIES, CommitRequest, Snapshot
from beam_supertable.format.schema import ID, conform
from beam_supertable.table.merge_insert import (
    MergeResult, Plan, live_rows, removed_of, run_planned)

__all__ = ["restore", "update"]


def update(table: Any, where: Optional[pc.Expression], values: Mapping[str, Any], *,
           metadata: Optional[Dict[str, Any]] = None,
           max_retries: int = DEFAULT_MAX_RETRIES) -> MergeResult:
    """See ``Supertable.update``."""
    uri = table.uri
    # The rows are rewritten whole: read them with the latest schema, so a
    # column another writer added since this handle's version keeps its values.
    table.refresh()
    if where is not None and not isinstance(where, pc.Expression):
        raise TypeError(f"{uri}: update where= takes a pyarrow expression or None, got {where!r}")
    if not isinstance(values, Mapping):
        raise TypeError(f"{uri}: update values= takes a dict {{column: value or expression}}, "
                        f"got {type(values).__name__}")
    if not values:
        raise ValueError(f"{uri}: update needs values={{column: value}}; none were given")
    schema = table.user_schema
    for name in values:
        if name not in schema.names:
            raise SchemaMismatchError(
                f"{uri}: update: column {name!r} is not in the table schema {schema.names}")
        if name in table.primary_key:
            raise SchemaMismatchError(
                f"{uri}: update: column {name!r} is a primary-key column and cannot be updated "
                f"(delete the row and upsert it under its new key)")
    vp = table._vector_props()
    vector = vp["column"] if vp else None
    _check_where(uri, where, schema)
    new_rows(uri, schema.empty_table(), values, schema, vector)   # refuse bad values early

    def plan(base: Snapshot) -> Plan:
        entries = pruned(base.entries(), where, base.schema) if where is not None \
            else base.entries()
        rows, which, pos = live_rows(table, base, entries)
        hit = np.arange(rows.num_rows) if where is None else np.where(mask(rows, where))[0]
        picked = [(entries[int(which[i])]["id"], int(pos[i])) for i in hit]
        return Plan(base.version, repr(picked).encode(),
                    new_rows(uri, rows.take(pa.array(hit, pa.int64())), values, schema, vector),
                    removed_of(entries, which[hit], pos[hit]), (0, len(hit), 0))

    return run_planned(table, "update", plan, max_retries=max_retries, metadata=metadata)


def _check_where(uri: str, where: Optional[pc.Expression], schema: pa.Schema) -> None:
    if where is None:
        return
    try:
        mask(schema.empty_table(), where)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(
            f"{uri}: update where={where} cannot be evaluated over the columns "
            f"{schema.names}: {str(exc).splitlines()[0]}") from None


def new_rows(uri: str, rows: pa.Table, values: Mapping[str, Any], schema: pa.Schema,
             vector: Optional[str]) -> pa.Table:
    """``rows`` with ``values`` applied (expressions see the old row), conformed."""
    exprs = {n: v for n, v in values.items() if isinstance(v, pc.Expression)}
    computed: Dict[str, Any] = {}
    if exprs:
        try:
            out = ds.dataset(rows).to_table(columns=exprs)
            computed = {n: out.column(n) for n in exprs}
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise SchemaMismatchError(
                f"{uri}: update: cannot evaluate {dict(exprs)} over the columns "
                f"{rows.column_names}: {str(exc).splitlines()[0]}") from None
    for name, value in values.items():
        field = schema.field(name)
        if name in computed:
            col = computed[name]
        else:
            try:
                scalar = value if isinstance(value, pa.Scalar) else pa.scalar(value, field.type)
                col = pa.array([scalar.as_py()] * rows.num_rows, field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
                raise SchemaMismatchError(
                    f"{uri}: update: value {value!r} for column {name!r} does not fit its type "
                    f"{field.type} ({str(exc).splitlines()[0]})") from None
        rows = rows.set_column(rows.schema.get_field_index(name), name, col)
    return conform(uri, rows, schema, vector)


def restore(table: Any, version: int, *, metadata: Optional[Dict[str, Any]] = None,
            max_retries: int = DEFAULT_MAX_RETRIES) -> int:
    """See ``Supertable.restore``."""
    uri = table.uri
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise VersionNotFoundError(f"{uri}: restore takes a version number, got {version!r}")
    try:
        old = table._manifest.load(int(version))
    except VersionNotFoundError as exc:
        why = str(exc)[len(uri) + 2:] if str(exc).startswith(uri) else str(exc)
        raise VersionNotFoundError(f"{uri}: cannot restore version {version}: {why}") from None
    table.refresh()   # the schema it replaces is the latest one, not this handle's
    old_handle = table.checkout(old.version)
    old_rows = old_handle.to_arrow()
    old_user = pa.schema([f for f in old.schema if f.name != ID])
    meta = {"restored_from": old.version, **(metadata or {})}

    def plan(base: Snapshot) -> Plan:
        entries = base.entries()
        same_schema = same_columns(base.schema, old.schema)
        if same_schema:
            ids = _ids(table, base, entries)
            now_ids = ids[0] if ids[0].size else np.zeros(0, np.int64)
            gone = ~np.isin(now_ids, old_rows.column(ID).to_numpy())
            back = ~np.isin(old_rows.column(ID).to_numpy(), now_ids)
            which, pos = ids[1][gone], ids[2][gone]
        else:
            _, which, pos = live_rows(table, base, entries)
            back = np.ones(old_rows.num_rows, dtype=bool)
        again = old_rows.filter(pa.array(back)).drop_columns([ID]).cast(old_user)
        written = repr((base.version if not same_schema else -1,
                        np.where(back)[0].tolist())).encode()
        return Plan(base.version, written, again, removed_of(entries, which, pos),
                    (int(back.sum()), 0, len(which)))

    schema_change = not same_columns(table.schema, old.schema)
    if not schema_change:
        return run_planned(table, "restore", plan, max_retries=max_retries, metadata=meta).version
    return _restore_schema(table, old, old_user, plan(table._manifest.load()), meta, max_retries)


def same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """Whether two schemas hold the same columns: names, types and field ids (a
    column dropped and added again under its name and type is another column)."""
    return a.remove_metadata().equals(b.remove_metadata(), check_metadata=True)


def _ids(table: Any, base: Snapshot, entries):
    """Live ``_id`` s of ``entries`` with their superfile index and row number."""
    ids, which, pos = [], [], []
    for i, entry in enumerate(entries):
        gone = table._deleted_rows(entry, base)
        col = table._reader(entry).read([ID]).column(ID).to_numpy()
        keep = np.ones(len(col), dtype=bool)
        keep[gone] = False
        rows = np.where(keep)[0].astype(np.int64)
        ids.append(col[rows])
        which.append(np.full(len(rows), i, np.int64))
        pos.append(rows)
    if not ids:
        z = np.zeros(0, np.int64)
        return z, z, z
    return np.concatenate(ids), np.concatenate(which), np.concatenate(pos)


def _restore_schema(table: Any, old: Snapshot, old_user: pa.Schema, plan: Plan,
                    meta: Dict[str, Any], max_retries: int) -> int:
    """A restore across a schema change: every current superfile leaves the
    version and the old rows are written again under the old schema, one commit."""
    rows = conform(table.uri, plan.rows, old_user, None)
    entries, stamp = table.write_superfiles(rows, conformed=True)

    def rebuild(base: Snapshot) -> Optional[CommitRequest]:
        current = base.entries()
        deleted = sum(len(table._deleted_rows(e, base)) for e in current)
        # The schema change is part of the table's schema history (inspect shows it).
        change = f"restore the schema of version {old.version}"
        history = list(base.properties.get(fields.SCHEMA_HISTORY) or []) + [
            {"version": base.version + 1, "change": change}]
        return CommitRequest(
            operation="restore", add_entries=tuple(entries),
            remove_entries=tuple(e["id"] for e in current), schema=old.schema,
            allow_schema_change=True, metadata=dict(meta), base_version=base.version,
            deleted_rows=-deleted, set_properties={**stamp, fields.SCHEMA_HISTORY: history},
            replace_properties=(fields.SCHEMA_HISTORY,))

    first = rebuild(table._manifest.load())
    return table.commit(first, rebuild=rebuild, max_retries=max_retries)
