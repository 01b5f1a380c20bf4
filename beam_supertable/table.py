"""``Supertable``: create, open, append, read, history and vacuum."""

from __future__ import annotations

import datetime
import io
import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.ids import new_ids
from beam_supertable.manifest import (
    DEFAULT_MAX_RETRIES, CommitRequest, Manifest, Snapshot, VacuumReport)
from beam_supertable.store import ObjectStore

__all__ = ["Supertable"]

ID = "_id"
DATA = "data"

Data = Union[pa.Table, pa.RecordBatch, Sequence[pa.RecordBatch]]


def _column_stats(table: pa.Table) -> Dict[str, List[Any]]:
    stats = {}
    for name in table.column_names:
        col = table.column(name)
        t = col.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
                or pa.types.is_boolean(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)):
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if isinstance(lo, (datetime.datetime, datetime.date)):
            lo, hi = lo.isoformat(), hi.isoformat()
        if isinstance(lo, float) and (lo != lo or hi != hi):
            continue
        stats[name] = [lo, hi]
    return stats


class Supertable:
    """A table of immutable Parquet superfiles published by OCC commits.

    Example::

        t = Supertable.create("memory://t", pa.schema([("x", pa.int64())]))
        t.append(pa.table({"x": [1, 2, 3]}))
        Supertable.open("memory://t").count_rows()   # 3
    """

    def __init__(self, store: ObjectStore, snapshot: Snapshot) -> None:
        self._store = store
        self._manifest = snapshot.manifest
        self._snapshot = snapshot

    # -- opening ---------------------------------------------------------
    @classmethod
    def create(cls, uri: str, schema: pa.Schema, *, storage_options: Optional[dict] = None,
               single_writer: bool = False, properties: Optional[dict] = None) -> "Supertable":
        """Creates an empty table; raises TableExistsError if one is there."""
        if ID in schema.names:
            raise SchemaMismatchError(f"{uri}: column {ID!r} is reserved for row ids")
        store = ObjectStore(uri, storage_options, single_writer=single_writer)
        full = pa.schema([pa.field(ID, pa.int64(), nullable=False)] + list(schema))
        snapshot = Manifest(store).create(full, properties or {})
        return cls(store, snapshot)

    @classmethod
    def open(cls, uri: str, version: Optional[int] = None, *,
             storage_options: Optional[dict] = None, single_writer: bool = False) -> "Supertable":
        """Opens one version (the latest by default): a consistent snapshot."""
        store = ObjectStore(uri, storage_options, single_writer=single_writer)
        return cls(store, Manifest(store).load(version))

    def refresh(self) -> "Supertable":
        """This table at its latest version."""
        return Supertable(self._store, self._manifest.load())

    # -- metadata --------------------------------------------------------
    @property
    def uri(self) -> str:
        return self._store.uri

    @property
    def version(self) -> int:
        return self._snapshot.version

    @property
    def schema(self) -> pa.Schema:
        return self._snapshot.schema

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def properties(self) -> Dict[str, Any]:
        return dict(self._snapshot.properties)

    def history(self) -> List[Dict[str, Any]]:
        return self._manifest.history()

    # -- writing ---------------------------------------------------------
    def _conform(self, data: Data) -> pa.Table:
        if isinstance(data, pa.RecordBatch):
            table = pa.Table.from_batches([data])
        elif isinstance(data, pa.Table):
            table = data
        else:
            batches = list(data)
            table = pa.Table.from_batches(batches) if batches else None
        user = pa.schema([f for f in self.schema if f.name != ID])
        if table is None:
            return user.empty_table()
        extra = [n for n in table.column_names if n not in user.names]
        if extra:
            raise SchemaMismatchError(
                f"{self.uri}: column(s) {extra} are not in the table schema {user.names}")
        cols = []
        for field in user:
            if field.name not in table.column_names:
                if not field.nullable:
                    raise SchemaMismatchError(
                        f"{self.uri}: non-nullable column {field.name!r} is missing")
                cols.append(pa.nulls(table.num_rows, field.type))
                continue
            col = table.column(field.name)
            if not col.type.equals(field.type):
                try:
                    col = col.cast(field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SchemaMismatchError(
                        f"{self.uri}: column {field.name!r} has type {col.type}, the table "
                        f"wants {field.type}: {exc}") from exc
            if not field.nullable and col.null_count:
                row = pc.index(pc.is_null(col), True).as_py()
                raise SchemaMismatchError(
                    f"{self.uri}: column {field.name!r} is not nullable but row {row} is null")
            cols.append(col)
        return pa.table(cols, schema=user)

    def write_superfile(self, table: pa.Table) -> dict:
        """Uploads one superfile (rows get fresh ids); returns its manifest entry."""
        ids = new_ids(table.num_rows)
        full = table.add_column(0, pa.field(ID, pa.int64(), nullable=False), pa.array(ids))
        buf = io.BytesIO()
        pq.write_table(full, buf, compression="zstd")
        data = buf.getvalue()
        sf = uuid.uuid4().hex
        path = f"{DATA}/{sf}.sf.parquet"
        self._store.put_if_absent(path, data)
        return {
            "id": sf, "path": path, "rows": table.num_rows, "bytes": len(data),
            "id_min": int(ids.min()) if len(ids) else None,
            "id_max": int(ids.max()) if len(ids) else None,
            "stats": _column_stats(full),
        }

    def append(self, data: Data, *, token: Optional[str] = None,
               metadata: Optional[Dict[str, Any]] = None,
               max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Appends rows as one commit; returns the new version (a no-op when empty).

        Args:
            token: idempotency token; appending again with a token that already
                landed returns that version and commits nothing.
            metadata: JSON data kept in the commit info (e.g. a source frontier).
            max_retries: lost races retried before CommitConflictError.
        """
        table = self._conform(data)
        if table.num_rows == 0:
            return self.version
        entry = self.write_superfile(table)
        return self.commit(CommitRequest(
            operation="append", add_entries=(entry,), token=token,
            metadata=dict(metadata or {}), base_version=self.version),
            max_retries=max_retries)

    def commit(self, request: CommitRequest, **kwargs) -> int:
        """Commits a prepared request; this handle moves to the new version."""
        self._snapshot = self._manifest.commit(request, **kwargs)
        return self._snapshot.version

    def vacuum(self, *, retain_versions: int = 10,
               older_than: Union[float, datetime.timedelta, None] = None) -> VacuumReport:
        kwargs = {} if older_than is None else {"older_than": older_than}
        return self._manifest.vacuum(retain_versions=retain_versions, **kwargs)

    # -- reading ---------------------------------------------------------
    def superfiles(self) -> List[dict]:
        return self._snapshot.entries()

    def to_arrow(self, columns: Optional[Sequence[str]] = None,
                 filter: Optional[pc.Expression] = None) -> pa.Table:  # noqa: A002 - Beam/pyarrow name
        """All rows of this version (with ``_id``), optionally projected and filtered."""
        tables = []
        for entry in self.superfiles():
            with self._store.fs.open(self._store.full(entry["path"]), "rb") as f:
                t = pq.read_table(f, columns=list(columns) if columns else None, filters=filter)
            tables.append(t)
        if not tables:
            schema = self.schema if not columns else pa.schema([self.schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)

    def count_rows(self, filter: Optional[pc.Expression] = None) -> int:  # noqa: A002
        if filter is None:
            return self._snapshot.totals.get("rows", 0)
        return self.to_arrow(filter=filter).num_rows
