"""Templated batch job: upsert commands (+ optional snapshot) -> changelog.

Run ``python -m pipelines.upsert_changes --help`` for the options. With no
arguments it runs on the sample in ``examples/`` and prints a summary.
"""

from __future__ import annotations

import os
from typing import List, Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.timestamp import Timestamp

from beam_upsert import Upsert
from beam_upsert.metrics import NAMESPACE
from pipelines.options import (
    add_job_argument, counter_totals, job_argv, job_options, local_parents, main,
    run_pipeline)
from pipelines.io_formats import (
    BAD_TAG, CHANGE_SCHEMA, JOB_NAMESPACE, ChangeToRow, ParseCommand, ParseSnapshot,
    change_to_parquet_row, is_parquet, read_rows, to_json)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DEFAULT_COMMANDS = os.path.join(EXAMPLES, "commands.jsonl")
DEFAULT_PRIOR = os.path.join(EXAMPLES, "prior.jsonl")
DEFAULT_OUTPUT = os.path.join("out", "changes.jsonl")


class UpsertChangesOptions(PipelineOptions):
    """Options of the upsert_changes job."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_job_argument(
            parser, "--commands", default=None,
            help="Upsert commands: JSON lines or Parquet (file or glob). "
                 "Default: the sample in examples/.")
        add_job_argument(
            parser, "--prior", default=None,
            help="Optional snapshot of (key, value) rows as of --resume-at: JSON lines or "
                 "Parquet. Default with the sample commands: examples/prior.jsonl.")
        add_job_argument(
            parser, "--resume-at", "--resume_at", dest="resume_at", type=float, default=None,
            help="Seconds since the epoch; commands earlier than this are already persisted.")
        add_job_argument(
            parser, "--output", default=DEFAULT_OUTPUT,
            help="Changelog path: .jsonl or .parquet (default: %(default)s). Malformed "
                 "input lines go to <output>.invalid.jsonl.")
        add_job_argument(
            parser, "--flavor", choices=("auto", "grouped", "stateful"), default="auto",
            help="Upsert flavor (default: %(default)s).")


def build(p: beam.Pipeline, job: UpsertChangesOptions) -> None:
    commands_path = job.commands or DEFAULT_COMMANDS
    prior_path = job.prior or (DEFAULT_PRIOR if job.commands is None else None)
    parsed = (read_rows(p, "ReadCommands", commands_path)
              | "ParseCommands" >> beam.ParDo(ParseCommand()).with_outputs(BAD_TAG, main="ok"))
    bad = [parsed[BAD_TAG]]
    prior = None
    if prior_path:
        snap = (read_rows(p, "ReadPrior", prior_path)
                | "ParseSnapshot" >> beam.ParDo(ParseSnapshot()).with_outputs(BAD_TAG, main="ok"))
        prior, bad = snap.ok, bad + [snap[BAD_TAG]]
    # The flag is in seconds; Upsert takes a Timestamp (a plain int would be µs).
    resume_at = None if job.resume_at is None else Timestamp(job.resume_at)
    result = parsed.ok | Upsert(job.flavor, prior=prior,
                                resume_at=resume_at).with_invalid_output()
    rows = result.changes | "ToRows" >> beam.ParDo(ChangeToRow())
    out = job.output
    if is_parquet(out):
        _ = (rows | "ToParquetRows" >> beam.Map(change_to_parquet_row)
             | "WriteParquet" >> beam.io.WriteToParquet(
                 out, CHANGE_SCHEMA, shard_name_template="", num_shards=1))
    else:
        _ = (rows | "ToJson" >> beam.Map(to_json)
             | "WriteJson" >> beam.io.WriteToText(out, shard_name_template="", num_shards=1))
    _ = ((tuple(bad) + (result.invalid,)) | "AllInvalid" >> beam.Flatten()
         | "InvalidJson" >> beam.Map(to_json)
         | "WriteInvalid" >> beam.io.WriteToText(
             out + ".invalid.jsonl", shard_name_template="", num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (NAMESPACE, JOB_NAMESPACE))


def run(argv: Optional[List[str]] = None) -> dict:
    options, job = job_options(job_argv(argv), UpsertChangesOptions,
                               "python -m pipelines.upsert_changes", __doc__)
    local_parents(job.output)
    result = run_pipeline(options, build, job)
    counts = summarize(result)
    print(
        f"upsert_changes: inserts={counts.get('inserts', 0)} "
        f"updates={counts.get('updates', 0)} deletes={counts.get('deletes', 0)} "
        f"dropped={counts.get('dropped_before_resume', 0)} "
        f"invalid={counts.get('invalid', 0) + counts.get('unparseable', 0)} "
        f"rehydrated={counts.get('rehydrated', 0)} "
        f"-> {job.output}")
    return counts


if __name__ == "__main__":
    main(run)
