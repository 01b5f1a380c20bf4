"""``ReadFromSupertable``: one version of a table, read in parallel by superfile."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics
from apache_beam.transforms.display import DisplayDataItem

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.filters import pruned
from beam_supertable.table.supertable import Supertable

__all__ = ["NAMESPACE", "ReadFromSupertable"]

NAMESPACE = "beam_supertable"   # the Beam metrics namespace of the read and write transforms


class _ListSuperfiles(beam.DoFn):
    def __init__(self, uri, storage_options, version, filter):  # noqa: A002
        self._uri, self._options, self._version, self._filter = uri, storage_options, version, filter

    def process(self, _):
        table = Supertable.open(self._uri, version=self._version, storage_options=self._options)
        yield from pruned(table.superfiles(), self._filter, table.schema)


class _ReadSuperfile(beam.DoFn):
    def __init__(self, uri, storage_options, version, columns, filter, as_batches):  # noqa: A002
        self._uri, self._options, self._version = uri, storage_options, version
        self._columns, self._filter, self._as_batches = columns, filter, as_batches

    def setup(self):
        self._table = Supertable.open(self._uri, version=self._version,
                                      storage_options=self._options)
        self._read = Metrics.counter(NAMESPACE, "rows_read")

    def process(self, entry):
        names = list(self._columns) if self._columns else self._table.schema.names
        table = self._table.read_superfile(entry, names, self._filter)
        self._read.inc(table.num_rows)
        if self._as_batches:
            yield from table.to_batches()
        else:
            yield from table.to_pylist()


class ReadFromSupertable(beam.PTransform):
    """Reads one version of a supertable, in parallel by superfile.

    Args:
        version: the version to read, or a tag's name (default: the latest
            when the pipeline is built, so every worker reads the same snapshot;
            a tag is resolved then too).
        columns: columns to return (default all, ``_id`` included).
        filter: a pyarrow expression; superfiles whose column statistics rule
            it out are skipped without being opened.
        as_batches: yield ``pyarrow.RecordBatch`` es instead of dict rows.
    """

    def __init__(self, uri: str, *, version: Union[int, str, None] = None,
                 columns: Optional[Sequence[str]] = None, filter: Optional[pc.Expression] = None,  # noqa: A002
                 as_batches: bool = False, storage_options: Optional[dict] = None,
                 label: Optional[str] = None) -> None:
        super().__init__(label)
        table = Supertable.open(uri, version=version, storage_options=storage_options)
        unknown = [c for c in (columns or ()) if c not in table.schema.names]
        if unknown:
            raise SchemaMismatchError(
                f"ReadFromSupertable: unknown column(s) {unknown}; the table has {table.schema.names}")
        self._uri, self._options = uri, storage_options
        self._version = table.version
        self._columns, self._filter, self._as_batches = columns, filter, as_batches

    def expand(self, pbegin):
        return (pbegin
                | "Start" >> beam.Create([None])
                | "ListSuperfiles" >> beam.ParDo(_ListSuperfiles(
                    self._uri, self._options, self._version, self._filter))
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadSuperfile(
                    self._uri, self._options, self._version, self._columns, self._filter,
                    self._as_batches)).with_output_types(
                        pa.RecordBatch if self._as_batches else Dict[str, Any]))

    def display_data(self):
        return {"uri": DisplayDataItem(self._uri, label="Table"),
                "version": DisplayDataItem(self._version, label="Version"),
                "columns": DisplayDataItem(", ".join(self._columns or ()) or "(all)",
                                           label="Columns"),
                "filter": DisplayDataItem(str(self._filter) if self._filter is not None else "",
                                          label="Filter"),
                "as_batches": DisplayDataItem(self._as_batches, label="Arrow batches")}
