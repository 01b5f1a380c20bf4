"""Rows from Parquet, JSON lines and CSV files, for the supertable jobs.

Formats go by extension (``.parquet``/``.pq``, ``.jsonl``/``.ndjson``/``.json``,
``.csv``) unless named; text files compressed as Beam reads them (``.gz``, ``.bz2``,
``.zst``, ...) are decompressed. JSON lines hold one object per line. CSV files have a
header line; a vector cell is a JSON array (``"[0.1, 0.2]"``); an empty cell
is null except in string columns. Rows that cannot be read become dead letters
``Invalid(element, reason)`` naming the file (and, for CSV, the line).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
from typing import Any, Dict, Iterable, List, Optional

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam import pvalue
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_supertable.jobs.io_formats import BAD_TAG, JOB_NAMESPACE
from beam_supertable.table.column_spec import parse_columns
from beam_upsert import Invalid

FORMATS = ("parquet", "jsonl", "csv")
_EXTENSIONS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
               ".json": "jsonl", ".csv": "csv"}
INFER_SAMPLE_ROWS = 1000


def format_of(path: str, explicit: Optional[str] = None) -> str:
    """The format named, or the one the path's extension says."""
    if explicit and explicit != "auto":
        if explicit not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS} or auto, got {explicit!r}")
        return explicit
    lowered = path.lower()
    if CompressionTypes.detect_compression_type(lowered) != CompressionTypes.UNCOMPRESSED:
        lowered = lowered.rsplit(".", 1)[0]   # rows.jsonl.gz: JSON lines, read decompressed
    for ext, fmt in _EXTENSIONS.items():
        if lowered.endswith(ext):
            return fmt
    raise ValueError(f"cannot tell the format of {path!r} from its extension "
                     f"({', '.join(_EXTENSIONS)}); name it with --format")


_FORMAT_NAMES = {"parquet": "Parquet", "jsonl": "JSON lines", "csv": "CSV"}
_SNIFF_BYTES = 1 << 20


def looks_like(path: str) -> Optional[str]:
    """The format the file's first bytes say (``parquet``, ``jsonl``, ``csv``); None when
    it is empty or says nothing clear."""
    with _open(path) as f:
        head = f.read(4)
        if head == b"PAR1":
            return "parquet"
        data = head
        while b"\n" not in data and len(data) < _SNIFF_BYTES:
            more = f.read(65536)
            if not more:
                break
            data += more
    text = data.decode("utf-8", "replace")
    first = next((line.strip() for line in text.splitlines() if line.strip()), None)
    if first is None:
        return None
    try:
        value = json.loads(first)
    except ValueError:
        value = None
        if first.startswith("{") and b"\n" not in data:
            return "jsonl"   # a JSON object longer than what was read
    if isinstance(value, dict):
        return "jsonl"
    if value is None and "," in first:
        return "csv"
    return None


def check_format(path: str, fmt: str) -> None:
    """ValueError, saying which format the file looks like, when it is not ``fmt``."""
    seen = looks_like(path)
    if seen is None or seen == fmt:
        return
    raise ValueError(f"{path}: read as {_FORMAT_NAMES[fmt]}, but it looks like "
                     f"{_FORMAT_NAMES[seen]}; pass --format {seen} or rename the file")


def parse_schema(spec: str) -> pa.Schema:
    """``"id:string,body:string,emb:float32[384]"`` -> a pyarrow schema.

    Types: ``string int64 int32 int16 int8 float64 float32 bool date timestamp
    binary`` and vectors ``float32[DIM]`` (also ``float16``/``float64``).
    """
    return parse_columns(spec, "--schema")


def first_file(pattern: str) -> str:
    metadata = FileSystems.match([pattern])[0].metadata_list
    if not metadata:
        raise FileNotFoundError(f"no files match {pattern!r}")
    return sorted(m.path for m in metadata)[0]


def _open(path: str):
    """The file's bytes, decompressed when its extension names a compression (``.gz``)."""
    return FileSystems.open(path, compression_type=CompressionTypes.AUTO)


class _Raw(io.RawIOBase):
    """A Beam file (a decompressing one too) as the raw stream ``io.TextIOWrapper`` reads."""

    def __init__(self, f) -> None:
        self._f = f

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._f.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _text(f) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BufferedReader(_Raw(f)), encoding="utf-8", newline="")


def open_text(path: str) -> io.TextIOWrapper:
    """The text of the file at ``path`` (any Beam file system; decompressed by extension)."""
    return _text(_open(path))


def _sample_rows(path: str, fmt: str, limit: int) -> List[dict]:
    with _open(path) as f:
        if fmt == "parquet":
            return pq.ParquetFile(f).read_row_group(0).slice(0, limit).to_pylist()
        text = _text(f)
        if fmt == "csv":
            rows = []
            for row in csv.DictReader(text):
                rows.append(row)
                if len(rows) == limit:
                    break
            return rows
        rows = []
        for line in text:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a dead letter when the job reads it
            if isinstance(row, dict):
                rows.append(row)
            if len(rows) == limit:
                break
        return rows


def sample_rows(path: str, fmt: str, limit: int = INFER_SAMPLE_ROWS) -> List[dict]:
    """Up to ``limit`` rows of the file at ``path`` (unreadable lines skipped)."""
    return _sample_rows(path, fmt, limit)


def _guess_text_type(values: List[str]) -> pa.DataType:
    present = [v for v in values if v != ""]
    for typ, parse in ((pa.int64(), int), (pa.float64(), float), (pa.bool_(), _parse_bool)):
        try:
            for v in present:
                parse(v)
            return typ if present else pa.string()
        except ValueError:
            continue
    return pa.string()


def infer_schema(pattern: str, fmt: str, vector_column: Optional[str] = None,
                 text_columns: Iterable[str] = ()) -> pa.Schema:
    """The schema of the first matching file (up to ``INFER_SAMPLE_ROWS`` rows).

    The vector column becomes ``fixed_size_list<float32, dim>`` with ``dim``
    from its first value; CSV columns become int64, float64, bool or string
    by what every sampled cell parses as.

    Raises:
        ValueError: a column whose type cannot be inferred, or a vector or
            text column that is missing or of the wrong kind; the message
            suggests ``--schema``.
    """
    path = first_file(pattern)
    text_columns = set(text_columns)
    if fmt == "parquet":
        with _open(path) as f:
            schema = pq.read_schema(f)
        rows = _sample_rows(path, fmt, 1) if vector_column else []
    else:
        rows = _sample_rows(path, fmt, INFER_SAMPLE_ROWS)
        if not rows:
            raise ValueError(f"{path}: no rows to infer a schema from; pass --schema")
        names = list(dict.fromkeys(k for row in rows for k in row if k is not None))
        fields = []
        for name in names:
            values = [row.get(name) for row in rows]
            if fmt == "csv" and name != vector_column:
                typ = pa.string() if name in text_columns else _guess_text_type(
                    [v or "" for v in values])
            else:
                try:
                    typ = pa.array(values).type
                except (pa.ArrowException, TypeError, ValueError) as exc:
                    if fmt != "csv":
                        raise ValueError(f"{path}: cannot infer one type for column {name!r} "
                                         f"({exc}); pass --schema") from exc
                    typ = pa.string()
            fields.append(pa.field(name, pa.string() if pa.types.is_null(typ) else typ))
        schema = pa.schema(fields)
    if vector_column is not None:
        schema = _with_vector(path, schema, rows, vector_column, fmt)
    for name in text_columns:
        if name not in schema.names or not pa.types.is_string(schema.field(name).type):
            raise ValueError(f"{path}: text column {name!r} is not a string column of "
                             f"{schema.names}; pass --schema")
    return schema


def _with_vector(path, schema, rows, column, fmt) -> pa.Schema:
    if column not in schema.names:
        raise ValueError(f"{path}: no vector column {column!r} in {schema.names}")
    typ = schema.field(column).type
    if pa.types.is_fixed_size_list(typ):
        dim = typ.list_size
    else:
        value = next((r.get(column) for r in rows if r.get(column) not in (None, "")), None)
        if fmt == "csv" and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        if not isinstance(value, list) or not value:
            raise ValueError(f"{path}: cannot tell the dimension of vector column {column!r} "
                             f"from its first value; pass --schema with {column}:float32[DIM]")
        dim = len(value)
    index = schema.get_field_index(column)
    return schema.set(index, pa.field(column, pa.list_(pa.float32(), dim)))


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "t", "yes", "1"):
        return True
    if lowered in ("false", "f", "no", "0"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _from_text(field: pa.Field, text: str) -> Any:
    """One cell's text as a value of the field's type (left as text if unknown)."""
    t = field.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return text
    if text == "":
        return None
    if pa.types.is_integer(t):
        return int(text)
    if pa.types.is_floating(t):
        return float(text)
    if pa.types.is_boolean(t):
        return _parse_bool(text)
    if pa.types.is_timestamp(t):
        value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)
    if pa.types.is_date(t):
        return datetime.date.fromisoformat(text)
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        value = json.loads(text)
        if not isinstance(value, list):
            raise ValueError(f"expected a JSON array, got {text[:40]!r}")
        return value
    return text


def coerce_row(row: Dict[str, Any], schema: pa.Schema) -> Dict[str, Any]:
    """Text values of non-text columns parsed to the column type (CSV cells, JSON dates).

    Raises:
        ValueError: naming the column whose text does not parse.
    """
    out = dict(row)
    for field in schema:
        value = out.get(field.name)
        if isinstance(value, str):
            try:
                out[field.name] = _from_text(field, value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"column {field.name!r}: {exc}") from exc
    return out


def dead_letter(element: Any, reason: str, counter: str = "unparseable") -> pvalue.TaggedOutput:
    """A dead letter ``Invalid(element, reason)`` on the ``BAD_TAG`` output, counted."""
    Metrics.counter(JOB_NAMESPACE, counter).inc()
    return pvalue.TaggedOutput(BAD_TAG, Invalid(element, reason))


class _ParseJsonLine(beam.DoFn):
    def process(self, element):
        path, line = element
        if not line.strip():
            return
        try:
            row = json.loads(line)
        except ValueError as exc:
            yield dead_letter(line, f"{path}: unparseable JSON: {exc}")
            return
        if not isinstance(row, dict):
            yield dead_letter(line, f"{path}: expected a JSON object, got {type(row).__name__}")
            return
        yield row


class _ReadCsv(beam.DoFn):
    """One CSV file -> dict rows (text cells); its own header names the columns."""

    def process(self, readable: fileio.ReadableFile):
        path = readable.metadata.path
        with readable.open(compression_type=CompressionTypes.AUTO) as f:
            reader = csv.DictReader(_text(f))
            width = None
            for row in reader:
                width = width or len(reader.fieldnames or ())
                if None in row or any(v is None for v in row.values()):
                    cells = [v for k, v in row.items() if k is not None] + list(row.get(None, []))
                    yield dead_letter(cells, f"{path} line {reader.line_num}: expected {width} "
                                             f"fields, got {len([c for c in cells if c is not None])}")
                    continue
                yield row


class _ParquetRows(beam.DoFn):
    def process(self, table: pa.Table):
        yield from table.to_pylist()


def read_rows(p, label: str, pattern: str, fmt: str, *, as_tables: bool = False):
    """Rows of the files matching ``pattern``.

    Returns:
        ``(rows, bad)``: dict rows (or, for Parquet with ``as_tables``, pyarrow
        Tables, one per row group), and dead letters.
    """
    if fmt == "parquet":
        tables = p | f"{label}Parquet" >> beam.io.ReadFromParquetBatched(pattern)
        rows = tables if as_tables else tables | f"{label}ParquetRows" >> beam.ParDo(_ParquetRows())
        bad = p | f"{label}NoBadParquet" >> beam.Create([])
        return rows, bad
    if fmt == "jsonl":
        parsed = (p | f"{label}Text" >> beam.io.ReadFromTextWithFilename(pattern)
                  | f"{label}Json" >> beam.ParDo(_ParseJsonLine()).with_outputs(BAD_TAG, main="ok"))
    else:
        parsed = (p | f"{label}Match" >> fileio.MatchFiles(pattern)
                  | f"{label}Open" >> fileio.ReadMatches()
                  | f"{label}Csv" >> beam.ParDo(_ReadCsv()).with_outputs(BAD_TAG, main="ok"))
    return parsed.ok, parsed[BAD_TAG]


def finite_vector(value: Any, dim: int) -> List[float]:
    """``value`` as a list of ``dim`` finite floats; ValueError saying what is wrong."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of {dim} numbers, got {type(value).__name__}")
    if len(value) != dim:
        raise ValueError(f"expected {dim} numbers, got {len(value)}")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"expected finite numbers, got {x!r}")
        out.append(float(x))
    return out
