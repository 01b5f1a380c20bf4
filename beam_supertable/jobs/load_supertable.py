"""Templated batch job: Parquet / JSON lines / CSV files -> a supertable.

Creates the table when absent (schema from --schema, or inferred from the first
file) with an optional vector index (--vector-column) and text index
(--text-columns), then loads every file as one commit. Rows that do not parse
or fit the schema go to the dead-letter file with the reason.

Run ``python -m pipelines.load_supertable --help`` (installed:
``beam-supertable-load --help``) for the options. With no arguments it loads
the sample ``chunks.jsonl`` shipped in ``beam_supertable/jobs/samples`` into
``out/chunks`` under the job id ``sample-chunks``, so a rerun commits nothing
new.
"""


from __future__ import annotations

import difflib
import os
from typing import Any, Dict, List, NamedTuple, Optional

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from beam_supertable import Supertable
from beam_supertable._program import program_name
from beam_supertable.format.row_reasons import row_problem
from beam_supertable.jobs.file_rows import (
    BAD_TAG, FORMATS, coerce_row, dead_letter, infer_schema, parse_schema, read_rows,
    sample_rows)
from beam_supertable.jobs.io_formats import JOB_NAMESPACE, to_json
from beam_supertable.jobs.options import (
    DeadLetters, JobError, JobParser, add_dead_letters, add_max_invalid, add_schema_mode,
    add_storage_options, check_invalid, counter_totals, default_dead_letters, input_format,
    job_argv, local_parents, new_run_id, open_table, parse, positive_int, require_input,
    run_pipeline, schema_difference, split_columns,
    storage_options)
from beam_supertable.jobs.options import main as job_main
from beam_supertable.transforms import NAMESPACE as TABLE_NAMESPACE
from beam_supertable.transforms import WriteToSupertable
from beam_supertable.vector.metric import METRICS
from beam_upsert import Invalid

__all__ = ["build_parser", "main", "plan", "run"]

PROG = program_name("python -m pipelines.load_supertable")
JOB = "load_supertable"
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")
DEFAULT_INPUT = os.path.join(SAMPLES, "chunks.jsonl")
DEFAULT_TABLE = os.path.join("out", "chunks")
SAMPLE_VECTOR_COLUMN = "embedding"
SAMPLE_TEXT_COLUMNS = "content"
SAMPLE_JOB_ID = "sample-chunks"


def build_parser() -> JobParser:
    parser = JobParser(PROG, __doc__)
    parser.add_argument(
        "--input", default=None, metavar="PATH",
        help="files to load (a path or a glob): Parquet, JSON lines or CSV with a header. "
             "Default: the sample chunks.jsonl")
    parser.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                        help="input format; auto: by extension")
    parser.add_argument(
        "--table", default=DEFAULT_TABLE, metavar="URI",
        help="the supertable (a local path, memory://..., s3://...); created when absent")
    parser.add_argument(
        "--schema", default=None, metavar="COLUMNS",
        help="columns of a new table, e.g. 'id:string,body:string,emb:float32[384]'. "
             "Default: inferred from the first file")
    parser.add_argument(
        "--vector-column", "--vector_column", dest="vector_column", default=None,
        metavar="COLUMN", help="column to vector-index when creating the table (the sample's: "
                               f"{SAMPLE_VECTOR_COLUMN})")
    parser.add_argument("--metric", choices=METRICS, default="l2",
                        help="vector metric of a new table")
    parser.add_argument(
        "--text-columns", "--text_columns", dest="text_columns", default=None,
        metavar="COLUMNS", help="comma-separated string columns to text-index when creating "
                                f"the table (the sample's: {SAMPLE_TEXT_COLUMNS})")
    parser.add_argument(
        "--n-cells", "--n_cells", dest="n_cells", type=positive_int, default=None,
        metavar="N", help="vector grid cells of a new table. Default: about sqrt(rows)")
    parser.add_argument(
        "--n-shards", "--n_shards", dest="n_shards", type=positive_int, default=None,
        metavar="N", help="superfiles to write. Default: by input size")
    add_storage_options(parser)
    parser.add_argument(
        "--job-id", "--job_id", dest="job_id", default=None, metavar="ID",
        help="a stable id (say, the batch's name) makes a rerun of the same load commit "
             f"nothing new. Default: one id per run ({SAMPLE_JOB_ID} for the sample)")
    add_schema_mode(parser)
    add_dead_letters(parser, JOB)
    add_max_invalid(parser, "rows")
    return parser


class _Coerce(beam.DoFn):
    """Text cells of non-text columns parsed to the table's types."""

    def __init__(self, schema: pa.Schema):
        self._schema = schema

    def process(self, row):
        try:
            yield coerce_row(row, self._schema)
        except ValueError as exc:
            yield dead_letter(row, str(exc), counter="uncoercible")


class _Count(beam.DoFn):
    """Counts the rows read (a Parquet batch counts its rows)."""

    def setup(self):
        self._read = Metrics.counter(JOB_NAMESPACE, "rows_read")

    def process(self, element):
        self._read.inc(element.num_rows if isinstance(element, pa.Table) else 1)
        yield element


def _as_invalid(bad) -> Invalid:
    if isinstance(bad, Invalid):
        return bad
    if isinstance(bad, dict):
        return Invalid(bad.get("element"), bad.get("reason"))
    return Invalid(*bad)


class Plan(NamedTuple):
    """What the job reads and how it writes, settled before the pipeline is built."""

    pattern: str
    format: str
    schema: pa.Schema
    create: Dict[str, Any]   # WriteToSupertable's create settings; {} for an existing table
    options: Optional[dict]
    job_id: Optional[str]


def _check_columns(flag: str, path: str, held: pa.Schema, got: pa.Schema) -> None:
    missing = [n for n in held.names if n not in got.names and not held.field(n).nullable]
    extra = [n for n in got.names if n not in held.names]
    if extra or missing:
        name = (extra or missing)[0]
        close = difflib.get_close_matches(name, held.names if extra else got.names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        what = (f"column {name!r}, which the table lacks" if extra
                else f"no column {name!r}, which the table needs")
        raise JobError(f"{flag}: {path} has {what}{hint}; the table's columns are "
                       f"{held.names}, the file's {got.names}")


def _check_values(flag: str, path: str, schema: pa.Schema, fmt: str, rows: List[dict],
                  vector_column: Optional[str]) -> None:
    """JobError when no sampled row fits a new table's schema: a wrong type (or a
    vector of another dimension) in ``--schema`` would otherwise create the table
    and reject every row."""
    if not rows:
        return
    problems = []
    for row in rows:
        try:
            row = coerce_row(row, schema) if fmt != "parquet" else row
        except ValueError as exc:
            problems.append(str(exc))
            continue
        problems.append(row_problem(row, schema, vector_column))
    if all(problems):
        raise JobError(f"{flag}: no row of {path} fits the new table's columns (the first: "
                       f"{problems[0]}); nothing was written")


def _in_path(path: str, exc: Exception) -> str:
    """``--input PATH: why``, naming the path once."""
    text = str(exc)
    return f"--input {text}" if text.startswith(path) else f"--input {path}: {text}"


def plan(args) -> Plan:
    sample = args.input is None
    pattern = args.input or DEFAULT_INPUT
    options = storage_options(args)
    path = require_input("--input", pattern)
    fmt = input_format("--input", path, args.format)
    job_id = args.job_id or (SAMPLE_JOB_ID if sample else None)
    schema = None
    if args.schema:
        try:
            schema = parse_schema(args.schema)
        except ValueError as exc:
            raise JobError(str(exc)) from None
    table = open_table("--table", args.table, options)
    vector_column = args.vector_column
    rows = sample_rows(path, fmt) if fmt != "parquet" else None
    if table is not None:
        merge = getattr(args, "schema_mode", "strict") == "merge"
        if schema is not None and not merge:
            differs = schema_difference(schema, table.user_schema)
            if differs:
                raise JobError(f"--schema does not match the table at {args.table}: {differs}")
        vp, fts = table.properties.get("vector"), table.properties.get("fts")
        held_vector = vp["column"] if vp else None
        if vector_column and vector_column != held_vector:
            raise JobError(f"--vector-column {vector_column}: the table at {args.table} "
                           f"indexes {held_vector!r}")
        held_text = fts["columns"] if fts else []
        if args.text_columns and split_columns(args.text_columns) != held_text:
            raise JobError(f"--text-columns {args.text_columns}: the table at {args.table} "
                           f"indexes {held_text}")
        if rows == []:   # an empty input: nothing to check, nothing to load
            return Plan(pattern, fmt, table.user_schema, {}, options, job_id)
        try:
            got = infer_schema(pattern, fmt, held_vector)
        except ValueError as exc:
            raise JobError(_in_path(path, exc)) from None
        held = table.user_schema
        if merge:
            # --schema-mode merge: the input's new columns join the table (the
            # sink adds them); the rows are coerced to their inferred types.
            held = pa.schema(list(held) + [pa.field(f.name, f.type) for f in
                                           (schema or got) if f.name not in held.names])
        _check_columns("--input", path, held, got)
        return Plan(pattern, fmt, held, {}, options, job_id)
    vector = vector_column or (SAMPLE_VECTOR_COLUMN if sample else None)
    text = split_columns(args.text_columns or (SAMPLE_TEXT_COLUMNS if sample else None))
    if rows == [] and schema is not None:
        inferred = schema
    else:
        try:
            inferred = infer_schema(pattern, fmt, vector if schema is None else None,
                                    text if schema is None else ())
        except ValueError as exc:
            raise JobError(_in_path(path, exc)) from None
    if schema is None:
        schema = inferred
    else:
        _check_columns("--schema", path, schema, inferred)
    for flag, column in [("--vector-column", vector)] + [("--text-columns", c) for c in text]:
        if column and column not in schema.names:
            raise JobError(f"{flag} {column}: not a column of the table; its columns are "
                           f"{schema.names}")
    _check_values("--schema" if args.schema else "--input", path, schema, fmt,
                  rows if rows is not None else sample_rows(path, fmt), vector)
    return Plan(pattern, fmt, schema, {"vector_column": vector, "metric": args.metric,
                                       "fts_columns": text, "n_cells": args.n_cells},
                options, job_id)


def build(p: beam.Pipeline, args, todo: Plan, part: str) -> None:
    rows, bad = read_rows(p, "Read", todo.pattern, todo.format, as_tables=True)
    rows = rows | "Count" >> beam.ParDo(_Count())
    if todo.format != "parquet":
        coerced = rows | "Coerce" >> beam.ParDo(_Coerce(todo.schema)).with_outputs(
            BAD_TAG, main="ok")
        rows, bad = coerced.ok, (bad, coerced[BAD_TAG]) | "ReadBad" >> beam.Flatten()
    merge = getattr(args, "schema_mode", "strict") == "merge"
    written = rows | "Write" >> WriteToSupertable(
        args.table, schema=None if merge and not todo.create else todo.schema,
        n_shards=args.n_shards, job_id=todo.job_id, storage_options=todo.options,
        schema_mode=getattr(args, "schema_mode", "strict"), **todo.create).with_invalid_output()
    _ = ((bad, written.invalid) | "AllBad" >> beam.Flatten()
         | "DeadLetter" >> beam.Map(_as_invalid)
         | "DeadLetterJson" >> beam.Map(to_json)
         | "WriteDeadLetters" >> beam.io.WriteToText(part, shard_name_template="",
                                                     num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (TABLE_NAMESPACE, JOB_NAMESPACE))


def run(argv: Optional[List[str]] = None) -> dict:
    """Runs the job; returns its counters (RejectedRun past ``--max-invalid``)."""
    options, args = parse(build_parser(), job_argv(argv))
    todo = plan(args)
    dead = DeadLetters(default_dead_letters(args.table, args.dead_letters, JOB),
                       new_run_id(todo.job_id))
    local_parents(args.table, dead.part)
    result = run_pipeline(options, build, args, todo, dead.part)
    counts = summarize(result)
    counts["version"] = Supertable.open(args.table, storage_options=todo.options).version
    counts["invalid"] = (counts.get("unparseable", 0) + counts.get("uncoercible", 0)
                         + counts.get("invalid_rows", 0))
    dead.finish(version=counts["version"])
    print(
        f"load_supertable: rows={counts.get('rows_committed', 0)} "
        f"invalid={counts['invalid']} commits={counts.get('commits', 0)} "
        f"version={counts['version']} -> {args.table} "
        f"(dead letters: {dead.path})", flush=True)
    total = counts.get("rows_read", 0) + counts.get("unparseable", 0)
    check_invalid(PROG, counts["invalid"], total, args.max_invalid)
    return counts


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pipelines.load_supertable``: runs the job; returns the exit status."""
    return job_main(run, argv, PROG)


if __name__ == "__main__":
    raise SystemExit(main())
