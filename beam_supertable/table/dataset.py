"""The live rows of a version as a dataset DuckDB and Polars scan directly.

``Supertable.to_pyarrow_dataset`` returns a :class:`LiveRows`: the Arrow
PyCapsule stream interface, and the part of ``pyarrow.dataset.Dataset`` that
``polars.scan_pyarrow_dataset`` calls, so projections and filters are pushed
down to the superfiles.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.format.filters import pruned


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
