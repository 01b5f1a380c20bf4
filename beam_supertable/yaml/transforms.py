"""The writing transforms as Beam YAML names them, and what every YAML transform shares.

Each class here is what ``providers.yaml`` maps a YAML transform name to;
Beam YAML calls it with the ``config:`` keys as keyword arguments. They
wrap the Python transforms of :mod:`beam_supertable.transforms` and
:mod:`beam_supertable.rag`: rows are ``beam.Row`` s (converted with
:mod:`beam_supertable.yaml.rows`), a filter is written as the jobs write it
(``"year >= 2010 and topic == 'space'"``), and rejected rows follow Beam
YAML's convention: with ``error_handling: {output: NAME}`` they leave on
that output as ``Row(element, msg, stack)`` (``element`` the input row,
``msg`` the reason) and the main output is ``good``; without it the first
rejected row fails the pipeline, as a built-in transform does.

Annotations here are real types, not strings: Beam YAML reads them to
describe each transform's config.
"""

from typing import Any, Dict, List, Optional, Union

import apache_beam as beam
import pyarrow.compute as pc
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP

from beam_supertable.cli import table_location_problem
from beam_supertable.errors import NotATableError, SchemaMismatchError
from beam_supertable.jobs.search_supertable import checked_filter
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms.upsert_write import UpsertToSupertable as _Upsert
from beam_supertable.transforms.write import WriteToSupertable as _Write
from beam_supertable.yaml import rows
from beam_upsert.model import UpsertCommand

__all__ = ["UpsertToSupertable", "WriteToSupertable"]   # the reads: beam_supertable.yaml.reads

GOOD = "good"                  # the main output's name when errors have their own
COMMIT_FIELDS = [("version", int), ("rows", int), ("superfiles", int), ("deduplicated", bool)]
DIFF_FIELD = "diff"            # ReadChangesFromSupertable: +1 inserted, -1 retracted
RESULTS_FIELD = "results"      # SearchSupertable: the top k rows of each element
DEFAULT_K = 3


def _error_output(error_handling: Optional[Dict[str, Any]], where: str) -> Optional[str]:
    if error_handling is None:
        return None
    output = error_handling.get("output") if isinstance(error_handling, dict) else None
    if not isinstance(output, str) or not output:
        raise ValueError(f"{where}: error_handling needs an output name, e.g. "
                         "error_handling: {output: errors}")
    extra = sorted(set(error_handling) - {"output"})
    if extra:
        raise ValueError(f"{where}: error_handling takes only output, got {extra}")
    return output


def _filter(text: Optional[str], where: str, schema) -> Optional[pc.Expression]:
    """The filter, its columns and literals checked against the table's ``schema``."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise TypeError(f"{where}: filter must be a string like \"year >= 2010\", got "
                        f"{type(text).__name__}")
    try:
        return checked_filter(text, schema)
    except ValueError as exc:
        raise ValueError(f"{where}: filter: {str(exc).removeprefix('--filter: ')}") from None


def _names(value: Union[str, List[str], None], where: str, key: str) -> Optional[List[str]]:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{where}: {key} must be a column name or a list of them, got {value!r}")
    return list(names)


def check_location(uri: Any, storage_options: Optional[dict], where: str) -> None:
    """ValueError, one line as the jobs say it: an empty ``uri``, a local one that is
    (or is inside) a file, storage options a local or memory table ignores."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"{where}: uri must name a table, got {uri!r}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"{where}: storage_options must be a mapping, got "
                        f"{type(storage_options).__name__}")
    problem = table_location_problem("uri", uri, storage_options)
    if problem:
        raise ValueError(f"{where}: {problem.replace('--storage-options:', 'storage_options:')}")


def _open(uri: str, storage_options: Optional[dict], where: str) -> Optional[Supertable]:
    check_location(uri, storage_options, where)
    try:
        return Supertable.open(uri, storage_options=storage_options)
    except (NotATableError, FileNotFoundError):
        return None


def _error_rows(invalid, element_type, rebuild, label: str):
    """``Invalid(element, reason)`` -> Beam YAML's ``Row(element, msg, stack)``."""
    return invalid | label >> beam.Map(
        lambda bad: beam.Row(element=rebuild(bad[0]), msg=str(bad[1]), stack="")
    ).with_output_types(rows.row_type([("element", element_type), ("msg", str),
                                       ("stack", str)]))


class _Fail(beam.DoFn):
    """No error output asked for: the first rejected row fails the pipeline."""

    def __init__(self, where: str) -> None:
        self._where = where

    def process(self, bad):
        raise SchemaMismatchError(f"{self._where}: {bad[1]} (route rejected rows with "
                                  "error_handling: {output: errors})")


def _outputs(good, invalid, error_output, element_type, rebuild, where: str):
    if error_output is None:
        _ = invalid | "FailOnInvalid" >> beam.ParDo(_Fail(where))
        return good
    return {GOOD: good,
            error_output: _error_rows(invalid, element_type, rebuild, "ErrorRows")}


# -- writes -------------------------------------------------------------------------
class WriteToSupertable(beam.PTransform):
    """Writes schema'd rows to a supertable, one exactly-once commit per bounded input.

    A missing table is created with the input's Beam schema as its columns.
    The output holds one ``Row(version, rows, superfiles, deduplicated)`` per
    commit (``good`` when ``error_handling`` is set).

    Args:
        uri: the table.
        storage_options: fsspec options of its store.
        vector_column: the field holding each row's vector (a list of numbers).
        vector_dim: the vectors' length, to create a table with a vector column.
        metric: the vector metric of a new table: l2, cosine or dot.
        fts_columns: string fields indexed for full-text search.
        job_id: a stable name of the load, so a rerun commits nothing twice.
        error_handling: ``{output: NAME}``: rows that do not fit the table go
            there instead of failing the pipeline.
    """

    def __init__(self, uri: str, storage_options: Optional[Dict[str, Any]] = None,
                 vector_column: Optional[str] = None, vector_dim: Optional[int] = None,
                 metric: Optional[str] = None, fts_columns: Optional[List[str]] = None,
                 job_id: Optional[str] = None,
                 error_handling: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self._where = "WriteToSupertable"
        self._error_output = _error_output(error_handling, self._where)
        self._uri, self._options = uri, storage_options
        self._table = _open(uri, storage_options, self._where)
        self._vector, self._dim, self._metric = vector_column, vector_dim, metric
        self._fts = _names(fts_columns, self._where, "fts_columns")
        self._job_id = job_id

    def expand(self, pcoll):
        fields = rows.input_fields(pcoll.element_type, self._where)
        schema = None
        if self._table is None:
            schema = rows.arrow_schema(self._where, fields, vector_column=self._vector,
                                       vector_dim=self._dim)
        else:
            extra = [n for n, _ in fields if n not in self._table.user_schema.names]
            if extra:
                raise SchemaMismatchError(
                    f"{self._where}: field(s) {extra} are not columns of {self._uri!r}; it has "
                    f"{self._table.user_schema.names}")
        write = _Write(self._uri, schema=schema, vector_column=self._vector, metric=self._metric,
                       fts_columns=self._fts, storage_options=self._options,
                       job_id=self._job_id, on_invalid="dead_letter").with_invalid_output()
        result = (pcoll
                  | "ToDicts" >> beam.Map(rows.to_dict)
                  | "Write" >> write)
        commits = result.commits | "CommitRows" >> beam.Map(
            lambda c: beam.Row(version=c.version, rows=c.rows, superfiles=c.superfiles,
                               deduplicated=c.deduplicated)
        ).with_output_types(rows.row_type(COMMIT_FIELDS))
        return _outputs(commits, result.invalid, self._error_output, pcoll.element_type,
                        rows.from_dict, self._where)


class _ToCommands(beam.DoFn):
    """A row -> ``UpsertCommand(key, row | None, offset)`` at the row's own time."""

    def __init__(self, key, offset, delete_when, where):
        self._key, self._offset, self._delete = key, offset, delete_when
        self._where = where

    def process(self, row, ts=beam.DoFn.TimestampParam):
        values = rows.to_dict(row)
        problem = None
        if ts == MIN_TIMESTAMP:
            problem = ("has no timestamp, and a command's time is its element's: give the "
                       "rows times first (AssignTimestamps)")
        elif values.get(self._offset) is None:
            problem = f"offset field {self._offset!r} is null"
        elif self._delete and not isinstance(values.get(self._delete), bool):
            problem = (f"delete_when field {self._delete!r} must be true or false, got "
                       f"{values.get(self._delete)!r}")
        if problem:
            yield beam.pvalue.TaggedOutput("refused", (values, f"row {values!r}: {problem}"))
            return
        offset = values.pop(self._offset)
        deleted = values.pop(self._delete) if self._delete else False
        key = values[self._key[0]] if len(self._key) == 1 else tuple(values[k] for k in self._key)
        yield TimestampedValue(UpsertCommand(key, None if deleted else values, offset), ts)


class UpsertToSupertable(beam.PTransform):
    """Upserts rows into a keyed supertable: each row replaces (or deletes) its key's row.

    Each row is a command at the row's own timestamp (assign one with
    ``AssignTimestamps``): per key, commands apply in time order and, at one
    time, the greatest ``offset`` wins. The table's columns are the input's
    fields but ``offset`` and ``delete_when``. A missing table is created
    from the input's Beam schema. A rerun of the same rows commits nothing
    (they are below the frontier the first run recorded). The output holds
    one ``Row(version, rows, superfiles, deduplicated)`` per commit.

    Args:
        uri: the table.
        storage_options: fsspec options of its store.
        primary_key: the key column(s); needed to create the table.
        offset: the field holding each command's offset.
        delete_when: a boolean field: true deletes the row's key.
        vector_column: the field holding each row's vector (a new table's).
        vector_dim: the vectors' length, to create a table with a vector column.
        metric: the vector metric of a new table: l2, cosine or dot.
        fts_columns: string fields indexed for full-text search (a new table's).
        job_id: names the commits.
        error_handling: ``{output: NAME}``: refused rows go there instead of
            failing the pipeline.
    """

    def __init__(self, uri: str, offset: str, storage_options: Optional[Dict[str, Any]] = None,
                 primary_key: Optional[List[str]] = None, delete_when: Optional[str] = None,
                 vector_column: Optional[str] = None, vector_dim: Optional[int] = None,
                 metric: str = "l2", fts_columns: Optional[List[str]] = None,
                 job_id: Optional[str] = None,
                 error_handling: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        where = self._where = "UpsertToSupertable"
        self._error_output = _error_output(error_handling, where)
        self._uri, self._options = uri, storage_options
        self._table = _open(uri, storage_options, where)
        if not isinstance(offset, str) or not offset:
            raise ValueError(f"{where}: offset must name the field holding each command's "
                             f"offset, got {offset!r}")
        if delete_when is not None and (not isinstance(delete_when, str) or not delete_when):
            raise ValueError(f"{where}: delete_when must name a boolean field, got "
                             f"{delete_when!r}")
        self._offset, self._delete = offset, delete_when
        key = _names(primary_key, where, "primary_key")
        if key is None and self._table is not None:
            key = self._table.primary_key or None
        if key is None:
            raise ValueError(f"{where}: no keyed table at {uri!r}; give primary_key: [...] to "
                             "create one")
        self._key = key
        self._vector, self._dim, self._metric = vector_column, vector_dim, metric
        self._fts = _names(fts_columns, where, "fts_columns") or []
        self._job_id = job_id

    def expand(self, pcoll):
        where = self._where
        fields = rows.input_fields(pcoll.element_type, where)
        names = [n for n, _ in fields]
        for role, name in (("offset", self._offset), ("delete_when", self._delete)):
            if name is not None and name not in names:
                raise SchemaMismatchError(f"{where}: {role} field {name!r} is not in the input's "
                                          f"fields {names}")
        columns = [(n, t) for n, t in fields if n not in (self._offset, self._delete)]
        missing = [k for k in self._key if k not in dict(columns)]
        if missing:
            raise SchemaMismatchError(f"{where}: primary key field(s) {missing} are not in the "
                                      f"input's fields {names}")
        schema = None
        if self._table is None:
            schema = rows.arrow_schema(where, columns, vector_column=self._vector,
                                       vector_dim=self._dim)
        else:
            extra = [n for n, _ in columns if n not in self._table.user_schema.names]
            if extra:
                raise SchemaMismatchError(
                    f"{where}: field(s) {extra} are not columns of {self._uri!r}; it has "
                    f"{self._table.user_schema.names} (offset and delete_when name the "
                    "fields that are not)")
        commands = pcoll | "ToCommands" >> beam.ParDo(_ToCommands(
            self._key, self._offset, self._delete, where)).with_outputs("refused", main="commands")
        result = commands.commands | "Upsert" >> _Upsert(
            self._uri, schema=schema, primary_key=self._key, vector_column=self._vector,
            metric=self._metric, fts_columns=self._fts, storage_options=self._options,
            job_id=self._job_id).with_invalid_output()
        commits = result.commits | "CommitRows" >> beam.Map(
            lambda c: beam.Row(version=c.version, rows=c.rows, superfiles=c.superfiles,
                               deduplicated=c.deduplicated)
        ).with_output_types(rows.row_type(COMMIT_FIELDS))
        invalid = (commands.refused, result.invalid) | "AllRefused" >> beam.Flatten()
        # The error row's element is the input row, rebuilt from its command;
        # a delete's other fields are null, so every field is nullable there.
        loose = rows.row_type([(n, Optional[t]) for n, t in fields])
        return _outputs(commits, invalid, self._error_output, loose,
                        _Rebuild(names, self._key, self._offset, self._delete), where)


class _Rebuild:
    """An upsert command (or an input row's dict) back as the input row."""

    def __init__(self, names, key, offset, delete_when):
        self._names, self._key, self._offset, self._delete = names, key, offset, delete_when

    def __call__(self, element):
        if isinstance(element, dict):   # refused before it became a command
            return rows.from_dict({n: element.get(n) for n in self._names})
        key, value, offset = element
        values = dict(value or {})
        keys = [key] if len(self._key) == 1 else list(key)
        values.update(zip(self._key, keys))
        values[self._offset] = offset
        if self._delete:
            values[self._delete] = value is None
        return rows.from_dict({n: values.get(n) for n in self._names})
