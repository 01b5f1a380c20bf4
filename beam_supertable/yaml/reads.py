"""The reading transforms as Beam YAML names them: a version, the change feed, search.

See :mod:`beam_supertable.yaml.transforms` for the conventions (rows,
filters, ``error_handling``). Reads give Rows whose fields are the table's
columns (all but ``_id`` unless ``columns`` names them), each nullable.
"""

from typing import Any, Dict, List, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError, SupertableError
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms.read import ReadFromSupertable as _Read
from beam_supertable.transforms.read_changes import ReadChangesFromSupertable as _ReadChanges
from beam_supertable.yaml import rows
from beam_supertable.yaml.transforms import (
    DEFAULT_K, DIFF_FIELD, RESULTS_FIELD, _error_output, _filter, _names, _outputs,
    check_location)

__all__ = ["ReadChangesFromSupertable", "ReadFromSupertable", "SearchSupertable"]


def _open_existing(uri: str, storage_options: Optional[dict], where: str,
                   version: Optional[int] = None) -> Supertable:
    check_location(uri, storage_options, where)
    return Supertable.open(uri, version=version, storage_options=storage_options)


def _columns(table: Supertable, columns: Optional[List[str]], where: str,
             leave_out: Optional[str] = None) -> List[str]:
    names = _names(columns, where, "columns")
    if names is None:
        return [c for c in table.user_schema.names if c != leave_out]
    unknown = [c for c in names if c not in table.user_schema.names]
    if unknown:
        raise SchemaMismatchError(f"{where}: unknown column(s) {unknown}; the table has "
                                  f"{table.user_schema.names}")
    return names


def _fields(table: Supertable, names: List[str], where: str):
    schema = table.user_schema
    return rows.beam_fields(where, pa.schema([schema.field(n) for n in names]))


class ReadFromSupertable(beam.PTransform):
    """Reads one version of a supertable as Rows of its columns.

    Args:
        uri: the table.
        storage_options: fsspec options of its store.
        version: the version to read (default: the latest when the pipeline is built).
        columns: the columns to read (default: all).
        filter: rows must pass it, e.g. ``"year >= 2010 and topic == 'space'"``;
            superfiles whose statistics rule it out are not opened.
    """

    def __init__(self, uri: str, storage_options: Optional[Dict[str, Any]] = None,
                 version: Optional[int] = None, columns: Optional[List[str]] = None,
                 filter: Optional[str] = None) -> None:  # noqa: A002 - the YAML key
        super().__init__()
        where = "ReadFromSupertable"
        table = _open_existing(uri, storage_options, where, version)
        self._names = _columns(table, columns, where)
        self._type = rows.row_type(_fields(table, self._names, where))
        self._read = _Read(uri, version=table.version, columns=self._names,
                           filter=_filter(filter, where, table.user_schema),
                           storage_options=storage_options)

    def expand(self, pbegin):
        names = self._names
        return (pbegin
                | "Read" >> self._read
                | "ToRows" >> beam.Map(lambda d: beam.Row(**rows.to_beam(d, names)))
                .with_output_types(self._type))


class ReadChangesFromSupertable(beam.PTransform):
    """A table's changes as Rows: the columns and ``diff`` (+1 inserted, -1 retracted).

    Each row is timestamped at the commit time of the version that made it.

    Args:
        uri: the table.
        storage_options: fsspec options of its store.
        start_version: the changes after this version (exclusive; 0 reads every change);
            needed unless a ``consumer`` resumes.
        end_version: the last version to read (default: keep reading as
            versions land; ``latest``: the latest version when the pipeline is built).
        columns: the columns to read (default: all).
        filter: rows must pass it, e.g. ``"year >= 2010"``.
        consumer: a name the reader records its progress under; a new run
            resumes there.
        poll_interval: seconds between looks for a new version while tailing.
    """

    def __init__(self, uri: str, storage_options: Optional[Dict[str, Any]] = None,
                 start_version: Optional[int] = None, end_version: Optional[Any] = None,
                 columns: Optional[List[str]] = None, filter: Optional[str] = None,  # noqa: A002
                 consumer: Optional[str] = None, poll_interval: float = 1.0) -> None:
        super().__init__()
        where = "ReadChangesFromSupertable"
        table = _open_existing(uri, storage_options, where)
        self._names = _columns(table, columns, where)
        if DIFF_FIELD in self._names:
            raise SchemaMismatchError(f"{where}: the table has a column named {DIFF_FIELD!r}, "
                                      "the field each change's sign takes; leave it out with "
                                      "columns: [...]")
        self._type = rows.row_type(_fields(table, self._names, where) + [(DIFF_FIELD, int)])
        self._read = _ReadChanges(uri, start_version=start_version, end_version=end_version,
                                  columns=self._names,
                                  filter=_filter(filter, where, table.user_schema),
                                  poll_interval=poll_interval, storage_options=storage_options,
                                  consumer=consumer)

    def expand(self, pbegin):
        names = self._names
        return (pbegin
                | "ReadChanges" >> self._read
                | "ToRows" >> beam.Map(
                    lambda c: beam.Row(**rows.to_beam(c.value, names), **{DIFF_FIELD: c.diff}))
                .with_output_types(self._type))


class _Search(beam.DoFn):
    """One element -> the element with its top k rows, or an error row."""

    def __init__(self, uri, options, vector_field, text_field, k, nprobe, expr, names, ranked):
        self._uri, self._options = uri, options
        self._vector, self._text, self._k, self._nprobe = vector_field, text_field, k, nprobe
        self._filter, self._names, self._ranked = expr, names, ranked

    def setup(self):
        self._table = Supertable.open(self._uri, storage_options=self._options)

    def process(self, row):
        values = rows.to_dict(row)
        try:
            vector = values.get(self._vector) if self._vector else None
            text = values.get(self._text) if self._text else None
            if self._vector and vector is None:
                raise ValueError(f"vector field {self._vector!r} is null")
            if self._text and not (isinstance(text, str) and text.strip()):
                raise ValueError(f"text field {self._text!r} is empty or not a string")
            if vector is not None:
                vector = np.asarray(vector, dtype=np.float32)
            hits = self._table.search(vector=vector, text=text, k=self._k, nprobe=self._nprobe,
                                      filter=self._filter, columns=self._names)
        except (SupertableError, ValueError, TypeError, pa.ArrowException) as exc:
            yield beam.pvalue.TaggedOutput("refused", (values, f"row {values!r}: {exc}"))
            return
        # Hybrid hits carry both; the fused _score is what ranks them.
        column = "_score" if self._ranked == "score" else "_distance"
        results = [beam.Row(**rows.to_beam(hit, self._names), **{self._ranked: hit[column]})
                   for hit in hits.to_pylist()]
        yield beam.Row(**rows.to_beam(values, list(values)), **{RESULTS_FIELD: results})


class SearchSupertable(beam.PTransform):
    """Per element: a vector field and/or a text field in, the top k rows of a table out.

    Each output row is the input row with a ``results`` field added: up to
    ``k`` rows of the table's columns, nearest first, each with ``distance``
    (vector search: smaller is closer) or ``score`` (text BM25, or hybrid
    when both fields are given: larger is better). ``Explode`` turns them
    into one row per result.

    Args:
        uri: the table.
        storage_options: fsspec options of its store.
        vector_field: the input field holding the query vector.
        text_field: the input field holding the query text.
        k: results per element.
        columns: the table columns each result carries (default: all but
            the vector column).
        filter: result rows must pass it, e.g. ``"year >= 2010"``.
        nprobe: vector cells probed per query (default: the table's measured default).
        error_handling: ``{output: NAME}``: elements that cannot be searched
            (a null vector, a vector of the wrong length, empty text) go
            there instead of failing the pipeline.
    """

    def __init__(self, uri: str, storage_options: Optional[Dict[str, Any]] = None,
                 vector_field: Optional[str] = None, text_field: Optional[str] = None,
                 k: int = DEFAULT_K, columns: Optional[List[str]] = None,
                 filter: Optional[str] = None, nprobe: Optional[int] = None,  # noqa: A002
                 error_handling: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        where = self._where = "SearchSupertable"
        self._error_output = _error_output(error_handling, where)
        if not vector_field and not text_field:
            raise ValueError(f"{where}: give vector_field, text_field or both")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{where}: k must be a positive int, got {k!r}")
        table = _open_existing(uri, storage_options, where)
        vp, fts = table.properties.get("vector"), table.properties.get("fts")
        if vector_field and vp is None:
            raise SupertableError(f"{where}: the table at {uri!r} has no vector index for "
                                  f"vector_field {vector_field!r}")
        if text_field and fts is None:
            raise SupertableError(f"{where}: the table at {uri!r} has no text index for "
                                  f"text_field {text_field!r}")
        self._names = _columns(table, columns, where, leave_out=vp["column"] if vp else None)
        self._ranked = "score" if text_field else "distance"
        clash = [c for c in self._names if c == self._ranked]
        if clash:
            raise SchemaMismatchError(f"{where}: column {self._ranked!r} clashes with each "
                                      f"result's {self._ranked}; leave it out with columns")
        self._result = rows.row_type(_fields(table, self._names, where)
                                     + [(self._ranked, float)])
        self._search = _Search(uri, storage_options, vector_field, text_field, k, nprobe,
                               _filter(filter, where, table.user_schema), self._names, self._ranked)
        self._fields = (vector_field, text_field)

    def expand(self, pcoll):
        fields = rows.input_fields(pcoll.element_type, self._where)
        names = [n for n, _ in fields]
        for role, name in zip(("vector_field", "text_field"), self._fields):
            if name is not None and name not in names:
                raise SchemaMismatchError(f"{self._where}: {role} {name!r} is not in the "
                                          f"input's fields {names}")
        if RESULTS_FIELD in names:
            raise SchemaMismatchError(f"{self._where}: the input already has a field named "
                                      f"{RESULTS_FIELD!r}, the field the results take")
        out = rows.row_type(fields + [(RESULTS_FIELD, List[self._result])])
        found = pcoll | "Search" >> beam.ParDo(self._search).with_outputs(
            "refused", main="found")
        typed = found.found | "Typed" >> beam.Map(lambda r: r).with_output_types(out)
        return _outputs(typed, found.refused, self._error_output, pcoll.element_type,
                        rows.from_dict, self._where)
