"""Templated batch job: Parquet / JSON lines / CSV files -> a supertable.

Creates the table when absent (schema from --schema, or inferred from the first
file) with an optional vector index (--vector-column) and text index
(--text-columns), then loads every file as one commit. Rows that do not parse
or fit the schema go to the dead-letter file with the reason.

Run ``python -m pipelines.load_supertable --help`` for the options. With no
arguments it loads the sample ``examples/chunks.jsonl`` into ``out/chunks``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from beam_supertable import Supertable
from beam_upsert import Invalid
from beam_supertable.transforms import NAMESPACE as TABLE_NAMESPACE
from beam_supertable.transforms import WriteToSupertable
from beam_supertable.vector.metric import METRICS
from pipelines.options import (
    add_job_argument, counter_totals, job_argv, job_options, local_parents, main, run_pipeline,
    split_columns)
from pipelines.options import dead_letters_path as _dead_letters_path
from pipelines.file_rows import (
    BAD_TAG, FORMATS, coerce_row, dead_letter, format_of, infer_schema, parse_schema, read_rows)
from pipelines.io_formats import JOB_NAMESPACE, to_json

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DEFAULT_INPUT = os.path.join(EXAMPLES, "chunks.jsonl")
DEFAULT_TABLE = os.path.join("out", "chunks")
SAMPLE_VECTOR_COLUMN = "embedding"
SAMPLE_TEXT_COLUMNS = "content"


class LoadSupertableOptions(PipelineOptions):
    """Options of the load_supertable job."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_job_argument(
            parser, "--input", default=None,
            help="Files to load (a path or glob): Parquet, JSON lines or CSV with a header. "
                 "Default: the sample examples/chunks.jsonl.")
        add_job_argument(
            parser, "--format", choices=("auto",) + FORMATS, default="auto",
            help="Input format (default: by extension).")
        add_job_argument(
            parser, "--table", default=DEFAULT_TABLE,
            help="The supertable (local path, memory://, s3://...); created when absent "
                 "(default: %(default)s).")
        add_job_argument(
            parser, "--schema", default=None,
            help="Columns of a new table, e.g. 'id:string,body:string,emb:float32[384]' "
                 "(default: inferred from the first file).")
        add_job_argument(
            parser, "--vector-column", "--vector_column", dest="vector_column", default=None,
            help="Column to vector-index when creating the table (default with the sample: "
                 f"{SAMPLE_VECTOR_COLUMN}).")
        add_job_argument(
            parser, "--metric", choices=METRICS, default="l2",
            help="Vector metric of a new table (default: %(default)s).")
        add_job_argument(
            parser, "--text-columns", "--text_columns", dest="text_columns", default=None,
            help="Comma-separated string columns to text-index when creating the table "
                 f"(default with the sample: {SAMPLE_TEXT_COLUMNS}).")
        add_job_argument(
            parser, "--n-cells", "--n_cells", dest="n_cells", type=int, default=None,
            help="Vector grid cells of a new table (default: about sqrt(rows)).")
        add_job_argument(
            parser, "--n-shards", "--n_shards", dest="n_shards", type=int, default=None,
            help="Superfiles to write (default: by input size).")
        add_job_argument(
            parser, "--job-id", "--job_id", dest="job_id", default=None,
            help="A stable id (say, the batch's name) makes a rerun of the same load commit "
                 "nothing new.")
        add_job_argument(
            parser, "--dead-letters", "--dead_letters", dest="dead_letters", default=None,
            help="JSON lines file of rows not loaded, with the reason (default: "
                 "<table>.invalid.jsonl for a local table, else out/load_supertable.invalid.jsonl).")


def dead_letters_path(job: LoadSupertableOptions) -> str:
    return _dead_letters_path(job.table, job.dead_letters, "load_supertable")


class _Coerce(beam.DoFn):
    """Text cells of non-text columns parsed to the table's types."""

    def __init__(self, schema: pa.Schema):
        self._schema = schema

    def process(self, row):
        try:
            yield coerce_row(row, self._schema)
        except ValueError as exc:
            yield dead_letter(row, str(exc))


def _to_dead_letter(bad) -> dict:
    if isinstance(bad, Invalid):  # WriteToSupertable's Invalid(row, reason)
        return {"element": bad.element, "reason": bad.reason}
    return bad


class Plan(NamedTuple):
    """What the job reads and how it writes, settled before the pipeline is built."""

    pattern: str
    format: str
    schema: pa.Schema
    create: Dict[str, Any]   # WriteToSupertable's create settings; {} for an existing table


def plan(job: LoadSupertableOptions) -> Plan:
    sample = job.input is None
    pattern = job.input or DEFAULT_INPUT
    fmt = format_of(pattern, job.format)
    try:
        table = Supertable.open(job.table)
    except FileNotFoundError:
        table = None
    if table is not None:
        if job.schema and not parse_schema(job.schema).equals(table.user_schema):
            raise ValueError(f"--schema does not match the table at {job.table!r}, which has:\n"
                             f"{table.user_schema}")
        vp, fts = table.properties.get("vector"), table.properties.get("fts")
        held_vector = vp["column"] if vp else None
        if job.vector_column and job.vector_column != held_vector:
            raise ValueError(f"--vector-column {job.vector_column!r}: the table at {job.table!r} "
                             f"indexes {held_vector!r}")
        held_text = fts["columns"] if fts else []
        if job.text_columns and split_columns(job.text_columns) != held_text:
            raise ValueError(f"--text-columns {job.text_columns!r}: the table at {job.table!r} "
                             f"indexes {held_text}")
        return Plan(pattern, fmt, table.user_schema, {})
    vector = job.vector_column or (SAMPLE_VECTOR_COLUMN if sample else None)
    text = split_columns(job.text_columns or (SAMPLE_TEXT_COLUMNS if sample else None))
    schema = parse_schema(job.schema) if job.schema else infer_schema(pattern, fmt, vector, text)
    return Plan(pattern, fmt, schema, {"vector_column": vector, "metric": job.metric,
                                       "fts_columns": text, "n_cells": job.n_cells})


def build(p: beam.Pipeline, job: LoadSupertableOptions) -> None:
    todo = plan(job)
    rows, bad = read_rows(p, "Read", todo.pattern, todo.format, as_tables=True)
    if todo.format != "parquet":
        coerced = rows | "Coerce" >> beam.ParDo(_Coerce(todo.schema)).with_outputs(
            BAD_TAG, main="ok")
        rows, bad = coerced.ok, (bad, coerced[BAD_TAG]) | "ReadBad" >> beam.Flatten()
    written = rows | "Write" >> WriteToSupertable(
        job.table, schema=todo.schema, n_shards=job.n_shards, job_id=job.job_id,
        **todo.create).with_invalid_output()
    _ = ((bad, written.invalid) | "AllBad" >> beam.Flatten()
         | "DeadLetter" >> beam.Map(_to_dead_letter)
         | "DeadLetterJson" >> beam.Map(to_json)
         | "WriteDeadLetters" >> beam.io.WriteToText(
             dead_letters_path(job), shard_name_template="", num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (TABLE_NAMESPACE, JOB_NAMESPACE))


def run(argv: Optional[List[str]] = None) -> dict:
    options, job = job_options(job_argv(argv), LoadSupertableOptions,
                               "python -m pipelines.load_supertable", __doc__,
                               raw_description=True)
    local_parents(job.table, dead_letters_path(job))
    result = run_pipeline(options, build, job)
    counts = summarize(result)
    counts["version"] = Supertable.open(job.table).version
    counts["invalid"] = counts.get("unparseable", 0) + counts.get("invalid_rows", 0)
    print(
        f"load_supertable: rows={counts.get('rows_committed', 0)} "
        f"invalid={counts['invalid']} commits={counts.get('commits', 0)} "
        f"version={counts['version']} -> {job.table} "
        f"(dead letters: {dead_letters_path(job)})")
    return counts


if __name__ == "__main__":
    main(run)
