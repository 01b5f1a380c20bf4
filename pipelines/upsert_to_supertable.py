"""Templated batch job: upsert commands -> a keyed supertable, the loop closed.

Reads upsert commands, reads the table's live rows back as the prior and its
frontier as the resume point, and applies the commands above the frontier as
ONE commit (replaced and deleted rows get deletion vectors, new values go in
as superfiles) that records the new frontier. Run it again on the same
commands and it changes nothing.

A command is ``{"key": ..., "offset": ..., "time": ..., "value": {...} | null}``
(JSON lines, or Parquet with the same columns, ``value`` a struct): ``time``
is seconds since the epoch or an ISO-8601 string, ``value`` the row (its key
column(s) may be left out: they are filled from ``key``; a composite key is
a JSON list), null deletes the key. ``{"error": "..."}`` in place of a value
(a value that failed to decode) is a dead letter.

Run ``python -m pipelines.upsert_to_supertable --help`` for the options. With
no arguments it applies the sample ``examples/commands.jsonl`` to the table
``out/sensors`` (created on the first run, keyed by ``key``).
"""

from __future__ import annotations

import json
import os
from typing import Any, List, Optional

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from beam_supertable import Supertable, UpsertToSupertable
from beam_supertable.upsert_write import NAMESPACE as TABLE_NAMESPACE
from beam_upsert import UpsertCommand
from beam_upsert.metrics import NAMESPACE as UPSERT_NAMESPACE
from pipelines.file_rows import (
    BAD_TAG, INFER_SAMPLE_ROWS, dead_letter, first_file, format_of, parse_schema)
from pipelines.io_formats import JOB_NAMESPACE, command_row, parse_key, parse_time, to_json
from pipelines.options import (
    add_job_argument, counter_totals, job_argv, job_options, local_parents, main, run_pipeline,
    split_columns)
from pipelines.options import dead_letters_path as _dead_letters_path

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DEFAULT_COMMANDS = os.path.join(EXAMPLES, "commands.jsonl")
DEFAULT_TABLE = os.path.join("out", "sensors")
DEFAULT_PRIMARY_KEY = "key"


class UpsertToSupertableOptions(PipelineOptions):
    """Options of the upsert_to_supertable job."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_job_argument(
            parser, "--commands", default=None,
            help="Upsert commands: JSON lines or Parquet (file or glob). Default: the sample "
                 "examples/commands.jsonl.")
        add_job_argument(
            parser, "--table", default=DEFAULT_TABLE,
            help="The keyed supertable (local path, memory://, s3://...); created when absent "
                 "(default: %(default)s).")
        add_job_argument(
            parser, "--primary-key", "--primary_key", dest="primary_key",
            default=DEFAULT_PRIMARY_KEY,
            help="Key column(s) of a new table, comma-separated (default: %(default)s); must "
                 "match an existing table's.")
        add_job_argument(
            parser, "--schema", default=None,
            help="Columns of a new table, e.g. 'key:string,reading:int64,emb:float32[8]' "
                 "(default: inferred from the values in the first command file).")
        add_job_argument(
            parser, "--vector-column", "--vector_column", dest="vector_column", default=None,
            help="Column to vector-index when creating the table.")
        add_job_argument(
            parser, "--text-columns", "--text_columns", dest="text_columns", default=None,
            help="Comma-separated string columns to text-index when creating the table.")
        add_job_argument(
            parser, "--storage-options", "--storage_options", dest="storage_options",
            default=None,
            help="fsspec storage options of the table as JSON, e.g. "
                 "'{\"client_kwargs\": {\"endpoint_url\": \"http://127.0.0.1:9000\"}}'.")
        add_job_argument(
            parser, "--job-id", "--job_id", dest="job_id", default=None,
            help="Names the job's commits (default: one id per run).")
        add_job_argument(
            parser, "--dead-letters", "--dead_letters", dest="dead_letters", default=None,
            help="JSON lines file of commands not applied, with the reason (default: "
                 "<table>.invalid.jsonl for a local table, else "
                 "out/upsert_to_supertable.invalid.jsonl).")


def dead_letters_path(job: UpsertToSupertableOptions) -> str:
    return _dead_letters_path(job.table, job.dead_letters, "upsert_to_supertable")


def with_key(value: dict, key: Any, names: List[str]) -> dict:
    """The row with its key column(s) filled from the command's key where absent."""
    parts = key if len(names) > 1 and isinstance(key, tuple) else (key,)
    row = dict(value)
    for name, part in zip(names, parts):
        row.setdefault(name, part)
    return row


class ParseTableCommand(beam.DoFn):
    """A JSON line or Parquet row -> a timestamped ``UpsertCommand(key, row | None, offset)``."""

    def __init__(self, primary_key: List[str]) -> None:
        self._names = primary_key

    def process(self, element):
        try:
            row = command_row(element)
            if row.get("error") is not None:
                raise ValueError(f"it carries an error instead of a value: {row['error']}")
            key, value = parse_key(row["key"]), row.get("value")
            if isinstance(value, dict):
                value = with_key(value, key, self._names)
            yield TimestampedValue(UpsertCommand(key, value, row["offset"]),
                                   parse_time(row["time"]))
        except ValueError as exc:
            yield dead_letter(element, f"unusable command: {exc}")


def _read(p, pattern: str, fmt: str):
    if fmt == "parquet":
        return p | "ReadParquet" >> beam.io.ReadFromParquet(pattern)
    if fmt != "jsonl":
        raise ValueError(f"--commands must be JSON lines or Parquet, got {fmt} ({pattern})")
    return p | "ReadJson" >> beam.io.ReadFromText(pattern)


def infer_schema(pattern: str, primary_key: List[str],
                 vector_column: Optional[str] = None) -> pa.Schema:
    """The table schema from the values of the first command file.

    Raises:
        ValueError: no usable values, or a column whose type cannot be
            inferred; the message suggests ``--schema``.
    """
    path = first_file(pattern)
    fmt = format_of(path)
    if fmt == "parquet":
        try:
            rows = pq.ParquetFile(path).read_row_group(0).slice(0, INFER_SAMPLE_ROWS).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            # (pyarrow's message names no file: "Parquet magic bytes not found".)
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from exc
    else:
        rows = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue   # a dead letter when the job reads it
                if len(rows) >= INFER_SAMPLE_ROWS:
                    break
    values = [with_key(r["value"], parse_key(r.get("key")), primary_key) for r in rows
              if isinstance(r, dict) and isinstance(r.get("value"), dict) and "key" in r]
    if not values:
        raise ValueError(f"{path}: no command with a value to infer the table's columns "
                         "from; pass --schema")
    names = list(dict.fromkeys(primary_key + [k for v in values for k in v]))
    fields = []
    for name in names:
        try:
            typ = pa.array([v.get(name) for v in values]).type
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: cannot infer one type for column {name!r} ({exc}); "
                             "pass --schema") from exc
        if name == vector_column:
            first = next((v[name] for v in values if v.get(name)), None)
            if not isinstance(first, list):
                raise ValueError(f"{path}: vector column {name!r} has no list value; pass "
                                 "--schema")
            typ = pa.list_(pa.float32(), len(first))
        fields.append(pa.field(name, pa.string() if pa.types.is_null(typ) else typ))
    return pa.schema(fields)


def build(p: beam.Pipeline, job: UpsertToSupertableOptions) -> None:
    pattern = job.commands or DEFAULT_COMMANDS
    keys = split_columns(job.primary_key) or [DEFAULT_PRIMARY_KEY]
    options = json.loads(job.storage_options) if job.storage_options else None
    try:
        Supertable.open(job.table, storage_options=options)
        schema = parse_schema(job.schema) if job.schema else None
        create = {}
    except FileNotFoundError:
        schema = parse_schema(job.schema) if job.schema else infer_schema(
            pattern, keys, job.vector_column)
        create = {"vector_column": job.vector_column,
                  "fts_columns": tuple(split_columns(job.text_columns))}
    parsed = (_read(p, pattern, format_of(first_file(pattern)))
              | "Parse" >> beam.ParDo(ParseTableCommand(keys)).with_outputs(BAD_TAG, main="ok"))
    written = parsed.ok | "Upsert" >> UpsertToSupertable(
        job.table, schema=schema, primary_key=keys, storage_options=options,
        job_id=job.job_id, **create).with_invalid_output()
    _ = ((parsed[BAD_TAG], written.invalid | "AsDeadLetter" >> beam.Map(
            lambda i: {"element": i.element, "reason": i.reason}))
         | "AllBad" >> beam.Flatten()
         | "DeadLetterJson" >> beam.Map(to_json)
         | "WriteDeadLetters" >> beam.io.WriteToText(
             dead_letters_path(job), shard_name_template="", num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (UPSERT_NAMESPACE, TABLE_NAMESPACE, JOB_NAMESPACE))


def run(argv: Optional[List[str]] = None) -> dict:
    options, job = job_options(job_argv(argv), UpsertToSupertableOptions,
                               "python -m pipelines.upsert_to_supertable", __doc__,
                               raw_description=True)
    local_parents(job.table, dead_letters_path(job))
    result = run_pipeline(options, build, job)
    counts = summarize(result)
    table = Supertable.open(job.table, storage_options=json.loads(job.storage_options)
                            if job.storage_options else None)
    counts["version"], counts["frontier"] = table.version, table.frontier
    counts["dropped"] = counts.get("dropped_before_resume", 0)
    counts["invalid"] = counts.get("invalid", 0) + counts.get("unparseable", 0)
    print(
        f"upsert_to_supertable: inserts={counts.get('inserts', 0)} "
        f"updates={counts.get('updates', 0)} deletes={counts.get('deletes', 0)} "
        f"dropped={counts['dropped']} invalid={counts['invalid']} "
        f"frontier={counts['frontier']} version={counts['version']} -> {job.table} "
        f"(dead letters: {dead_letters_path(job)})")
    return counts


if __name__ == "__main__":
    main(run)
