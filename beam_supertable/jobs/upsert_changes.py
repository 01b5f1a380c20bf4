"""Templated batch job: upsert commands (+ optional snapshot) -> changelog.

Run ``python -m pipelines.upsert_changes --help`` (installed:
``beam-upsert-changes --help``) for the options. With no arguments it runs on
the sample shipped in ``beam_supertable/jobs/samples`` and prints a summary.
"""

from __future__ import annotations

import os
from typing import List, Optional

import apache_beam as beam
from apache_beam.utils.timestamp import Timestamp

from beam_supertable._program import program_name
from beam_supertable.jobs.io_formats import (
    BAD_TAG, CHANGE_SCHEMA, JOB_NAMESPACE, ChangeToRow, ParseCommand, ParseSnapshot,
    change_to_parquet_row, is_parquet, read_rows, to_json)
from beam_supertable.jobs.options import (
    DeadLetters, JobParser, add_max_invalid, check_invalid, counter_totals, input_format,
    job_argv, local_parents, new_run_id, output_file, parse, require_input, run_pipeline)
from beam_supertable.jobs.options import main as job_main
from beam_upsert import Upsert
from beam_upsert.metrics import NAMESPACE

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")
DEFAULT_COMMANDS = os.path.join(SAMPLES, "commands.jsonl")
DEFAULT_PRIOR = os.path.join(SAMPLES, "prior.jsonl")
DEFAULT_OUTPUT = os.path.join("out", "changes.jsonl")
PROG = program_name("python -m pipelines.upsert_changes")


def build_parser() -> JobParser:
    parser = JobParser(PROG, __doc__)
    parser.add_argument(
        "--commands", default=None, metavar="PATH",
        help="upsert commands: JSON lines or Parquet (a file or a glob). Default: the sample "
             "commands.jsonl")
    parser.add_argument(
        "--prior", default=None, metavar="PATH",
        help="a snapshot of (key, value) rows as of --resume-at: JSON lines or Parquet. "
             "Default with the sample commands: the sample prior.jsonl")
    parser.add_argument(
        "--resume-at", "--resume_at", dest="resume_at", type=float, default=None,
        metavar="SECONDS",
        help="seconds since the epoch; commands earlier than this are already persisted")
    parser.add_argument(
        "--output", default=DEFAULT_OUTPUT, metavar="PATH",
        help="the changelog: .jsonl or .parquet; malformed input is appended to "
             "<output>.invalid.jsonl")
    parser.add_argument("--flavor", choices=("auto", "grouped", "stateful"), default="auto",
                        help="upsert flavor")
    add_max_invalid(parser, "commands")
    return parser


def build(p: beam.Pipeline, job, part: str) -> None:
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
         | "WriteInvalid" >> beam.io.WriteToText(part, shard_name_template="", num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (NAMESPACE, JOB_NAMESPACE))


def run(argv: Optional[List[str]] = None) -> dict:
    """Runs the job; returns its counters (RejectedRun past ``--max-invalid``)."""
    options, args = parse(build_parser(), job_argv(argv))
    output_file("--output", args.output, parquet=True)
    for flag, pattern in (("--commands", args.commands or DEFAULT_COMMANDS),
                          ("--prior", args.prior)):
        if pattern:   # JSON lines unless Parquet by name, as read_rows reads them
            path = require_input(flag, pattern)
            input_format(flag, path, "parquet" if is_parquet(path) else "jsonl")
    dead = DeadLetters(args.output + ".invalid.jsonl", new_run_id(), "--output")
    local_parents(args.output, dead.part)
    result = run_pipeline(options, build, args, dead.part)
    counts = summarize(result)
    dead.finish()
    invalid = counts.get("invalid", 0) + counts.get("unparseable", 0)
    print(
        f"upsert_changes: inserts={counts.get('inserts', 0)} "
        f"updates={counts.get('updates', 0)} deletes={counts.get('deletes', 0)} "
        f"dropped={counts.get('dropped_before_resume', 0)} "
        f"invalid={invalid} "
        f"rehydrated={counts.get('rehydrated', 0)} "
        f"-> {args.output}", flush=True)
    check_invalid(PROG, invalid, counts.get("commands_read", 0), args.max_invalid)
    return counts


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pipelines.upsert_changes``: runs the job; returns the exit status."""
    return job_main(run, argv, PROG)


if __name__ == "__main__":
    raise SystemExit(main())
