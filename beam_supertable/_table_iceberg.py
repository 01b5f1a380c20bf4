"""The table as other engines open it: its Iceberg metadata, and a dataset face.

Mixed into ``Supertable``: ``iceberg_metadata_location`` and ``sync_iceberg``
(see :mod:`beam_supertable.iceberg`), and ``to_pyarrow_dataset``, the live rows
of a version as something DuckDB and Polars scan directly.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import iceberg
from beam_supertable.errors import IcebergDisabledError
from beam_supertable.filters import pruned
from beam_supertable.manifest import CommitRequest


class TableIceberg:
    """The Iceberg face of ``Supertable`` (mixed into the table)."""

    def iceberg_metadata_location(self, version: Optional[int] = None) -> str:
        """The absolute URI of the Iceberg metadata file whose current snapshot is ``version``.

        ``pyiceberg.table.StaticTable.from_metadata(location)``, DuckDB's
        ``iceberg_scan(location)`` and Spark open it as they are. Metadata a
        crash left unwritten is written now (it is a function of the version).

        Args:
            version: a version of the table (default: this handle's).

        Raises:
            IcebergDisabledError: the table keeps no Iceberg metadata; run
                ``sync_iceberg()`` (``beam-supertable iceberg sync``) once.
            VersionNotFoundError: no such version (or vacuumed).
            CorruptManifestError: the metadata file is there but unreadable.
        """
        snapshot = self._snapshot if version is None or version == self.version \
            else self._manifest.load(version)
        if not iceberg.is_enabled(snapshot):
            raise IcebergDisabledError(
                f"{self.uri}: version {snapshot.version} keeps no Iceberg metadata (the table "
                "was created with iceberg=False or by an older release); run "
                "Supertable.sync_iceberg() or `beam-supertable iceberg sync --table URI` once")
        path = self._manifest.iceberg.ensure(snapshot)
        return f"{iceberg.table_location(self.store)}/{path}"

    def sync_iceberg(self) -> str:
        """Turns the Iceberg metadata on (a commit, when it is off) and writes it for the
        latest version; returns that version's metadata location.

        Every later commit writes its own. The latest version's metadata is
        checked object by object: one that is missing or unreadable (a manifest
        deleted by hand, a torn file) is written again. Idempotent: a table
        whose metadata is whole writes nothing.

        Raises:
            SchemaMismatchError: a column has no Iceberg type (it names it).
        """
        self.refresh()
        if not iceberg.is_enabled(self._snapshot):
            iceberg.check_schema(self.uri, self.schema)
            snapshot = self._manifest.commit(CommitRequest(
                operation="iceberg",
                set_properties={iceberg.ENABLED_PROPERTY: dict(iceberg.ENABLED_VALUE)}))
            self._snapshot = snapshot
        path = self._manifest.iceberg.repair(self._snapshot)
        return f"{iceberg.table_location(self.store)}/{path}"

    def to_pyarrow_dataset(self, version: Optional[int] = None) -> "LiveRows":
        """The live rows of ``version`` (default: this handle's) for DuckDB and Polars.

        The result implements the Arrow PyCapsule stream interface
        (``__arrow_c_stream__``: ``duckdb.sql("select ... from rows")``,
        ``polars.DataFrame(rows)``, ``pyarrow.table(rows)``), and the part of
        ``pyarrow.dataset.Dataset`` that ``polars.scan_pyarrow_dataset`` calls
        (``schema``, ``to_table``, ``scanner``, ``to_batches``, ``count_rows``), so Polars pushes
        projections and filters down: superfiles whose statistics rule a
        filter out are not read, and only the asked-for columns are. Deleted
        rows are never returned.
        """
        table = self if version is None or version == self.version else self.checkout(version)
        return LiveRows(table)


class LiveRows:
    """A version's live rows, scanned superfile by superfile (see ``to_pyarrow_dataset``)."""

    def __init__(self, table: Any) -> None:
        self._table = table
        self.schema: pa.Schema = table.schema

    def __repr__(self) -> str:
        return f"LiveRows({self._table.uri!r}, version={self._table.version})"

    def _batches(self, columns: Optional[Sequence[str]],
                 filter: Optional[pc.Expression]) -> Iterator[pa.RecordBatch]:  # noqa: A002
        table = self._table
        names = list(columns) if columns is not None else self.schema.names
        unknown = [c for c in names if c not in self.schema.names]
        if unknown:
            raise KeyError(f"{table.uri}: unknown column(s) {unknown}")
        for entry in pruned(table.superfiles(), filter, table.schema):
            yield from table.read_superfile(entry, names, filter).to_batches()

    def _schema_of(self, columns: Optional[Sequence[str]]) -> pa.Schema:
        names = list(columns) if columns is not None else self.schema.names
        return pa.schema([self.schema.field(c) for c in names])

    def scanner(self, columns: Optional[Sequence[str]] = None,
                filter: Optional[pc.Expression] = None, **_: Any) -> "LiveRowsScanner":  # noqa: A002
        return LiveRowsScanner(self, columns, filter)

    def to_batches(self, columns: Optional[Sequence[str]] = None,
                   filter: Optional[pc.Expression] = None, **_: Any) -> Iterator[pa.RecordBatch]:  # noqa: A002
        return self._batches(columns, filter)

    def to_table(self, columns: Optional[Sequence[str]] = None,
                 filter: Optional[pc.Expression] = None, **_: Any) -> pa.Table:  # noqa: A002
        return pa.Table.from_batches(list(self._batches(columns, filter)),
                                     schema=self._schema_of(columns))

    def to_reader(self, columns: Optional[Sequence[str]] = None,
                  filter: Optional[pc.Expression] = None) -> pa.RecordBatchReader:  # noqa: A002
        return pa.RecordBatchReader.from_batches(self._schema_of(columns),
                                                 self._batches(columns, filter))

    def count_rows(self, filter: Optional[pc.Expression] = None, **_: Any) -> int:  # noqa: A002
        if filter is None:
            return self._table.count_rows()
        return sum(b.num_rows for b in self._batches([self.schema.names[0]], filter))

    def head(self, num_rows: int, columns: Optional[Sequence[str]] = None,
             filter: Optional[pc.Expression] = None, **_: Any) -> pa.Table:  # noqa: A002
        out: List[pa.RecordBatch] = []
        left = num_rows
        for batch in self._batches(columns, filter):
            if left <= 0:
                break
            out.append(batch.slice(0, left))
            left -= len(out[-1])
        return pa.Table.from_batches(out, schema=self._schema_of(columns))

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_reader().__arrow_c_stream__(requested_schema)


class LiveRowsScanner:
    """``LiveRows.scanner(...)``: what ``pyarrow.dataset.Scanner`` offers readers."""

    def __init__(self, rows: LiveRows, columns, filter) -> None:  # noqa: A002
        self._rows, self._columns, self._filter = rows, columns, filter
        self.projected_schema = rows._schema_of(columns)

    def to_table(self) -> pa.Table:
        return self._rows.to_table(self._columns, self._filter)

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        return self._rows.to_batches(self._columns, self._filter)

    def to_reader(self) -> pa.RecordBatchReader:
        return self._rows.to_reader(self._columns, self._filter)

    def count_rows(self) -> int:
        return self._rows.count_rows(self._filter)

    def head(self, num_rows: int) -> pa.Table:
        return self._rows.head(num_rows, self._columns, self._filter)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_reader().__arrow_c_stream__(requested_schema)
