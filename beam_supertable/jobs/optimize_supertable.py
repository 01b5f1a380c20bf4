"""Templated batch job: optimize a supertable, rewriting in parallel workers.

The same operation as ``Supertable.optimize`` (see ``beam_supertable.table.optimize``),
split the way a cluster runs it: the launcher plans on the table's latest
version (``plan_optimize``: groups of superfiles per cell range), the groups
are spread over the workers (``Reshuffle``), each worker rewrites its groups
(``rewrite_group``), and one step commits every new superfile at once
(``commit_optimize``), with an idempotency token derived from the plan: a
retried commit lands once, and a rerun of the job plans on the optimized
table and finds nothing to do. Appends, deletes and upserts landing while the
job runs are kept (deletes carried over by ``_id``).

Run ``python -m pipelines.optimize_supertable --help`` (installed:
``beam-supertable-optimize --help``) for the options; any Beam option
(``--runner=FlinkRunner`` ...) is accepted too.
"""

from __future__ import annotations

import json
from typing import List, Optional

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_supertable import Supertable
from beam_supertable._program import program_name
from beam_supertable.jobs.io_formats import JOB_NAMESPACE
from beam_supertable.table.optimize import (
    DEFAULT_TARGET_FILE_BYTES, OptimizePlan, commit_optimize, plan_optimize, rewrite_group)

PROG = program_name("python -m pipelines.optimize_supertable")
from beam_supertable.jobs.options import (
    JobParser, add_storage_options, byte_size, counter_totals, job_argv, open_table, parse,
    positive_int, run_pipeline, storage_options)
from beam_supertable.jobs.options import main as job_main


def build_parser() -> JobParser:
    parser = JobParser(PROG, __doc__, rejects=False)
    parser.add_argument("--table", required=True, metavar="URI",
                        help="the supertable to optimize (a local path, memory://..., s3://...)")
    parser.add_argument(
        "--target-file-bytes", "--target_file_bytes", dest="target_file_bytes", type=byte_size,
        default=DEFAULT_TARGET_FILE_BYTES, metavar="SIZE",
        help="size rewritten superfiles aim at, in bytes or with a unit (default: 64MiB)")
    parser.add_argument(
        "--max-cell-rows", "--max_cell_rows", dest="max_cell_rows", type=positive_int,
        default=None, metavar="N",
        help="split cells holding more live rows. Default: max(256, 2*sqrt(live rows))")
    parser.add_argument(
        "--max-rewrite-bytes", "--max_rewrite_bytes", dest="max_rewrite_bytes", type=byte_size,
        default=None, metavar="SIZE",
        help="rewrite at most about this much (8GiB). Default: all")
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                        help="print the plan as JSON; write nothing")
    add_storage_options(parser)
    return parser


class _Rewrite(beam.DoFn):
    """A group number -> the entries of the superfiles it was rewritten into."""

    def __init__(self, uri: str, plan: OptimizePlan, options: Optional[dict] = None):
        self._uri, self._plan, self._options = uri, plan, options

    def setup(self):
        self._table = Supertable.open(self._uri, version=self._plan.version,
                                      storage_options=self._options)
        self._groups = Metrics.counter(JOB_NAMESPACE, "groups_rewritten")
        self._rows = Metrics.counter(JOB_NAMESPACE, "rows_rewritten")

    def process(self, number: int):
        entries = rewrite_group(self._table, self._plan, self._plan.groups[number])
        self._groups.inc()
        self._rows.inc(sum(e["rows"] for e in entries))
        yield from entries


class _Commit(beam.DoFn):
    """Every group's entries -> one commit; yields the version holding it."""

    def __init__(self, uri: str, plan: OptimizePlan, options: Optional[dict] = None):
        self._uri, self._plan, self._options = uri, plan, options

    def process(self, entries: List[dict]):
        table = Supertable.open(self._uri, storage_options=self._options)
        version = commit_optimize(table, self._plan, entries)
        Metrics.counter(JOB_NAMESPACE, "commits").inc(0 if table.snapshot.deduplicated else 1)
        yield version


def build(p: beam.Pipeline, uri: str, plan: OptimizePlan,
          options: Optional[dict] = None) -> beam.PCollection:
    """The rewrite and commit of ``plan``; returns a PCollection of the one version."""
    return (p
            | "Groups" >> beam.Create(list(range(len(plan.groups))))
            | "Spread" >> beam.Reshuffle()
            | "Rewrite" >> beam.ParDo(_Rewrite(uri, plan, options))
            | "Gather" >> beam.combiners.ToList()
            | "Commit" >> beam.ParDo(_Commit(uri, plan, options)))


def run(argv: Optional[List[str]] = None) -> dict:
    """Runs the job; returns ``{"version": ..., "plan": ...}`` (version None: nothing to do)."""
    options, args = parse(build_parser(), job_argv(argv))
    store_options = storage_options(args)
    table = open_table("--table", args.table, store_options, must_exist=True)
    plan = plan_optimize(table, target_file_bytes=args.target_file_bytes,
                         max_cell_rows=args.max_cell_rows,
                         max_rewrite_bytes=args.max_rewrite_bytes)
    summary = {"plan": plan.to_dict(), "version": None}
    if args.dry_run or plan.empty:
        print(f"optimize_supertable: {'dry run' if args.dry_run else 'nothing to do'}: "
              f"{json.dumps({k: v for k, v in plan.to_dict().items() if k != 'groups'})}",
              flush=True)
        return summary
    result = run_pipeline(options, build, args.table, plan, store_options)
    table.refresh()
    summary["version"] = table.version
    summary["counters"] = counter_totals(result, (JOB_NAMESPACE,))
    print(f"optimize_supertable: rewrote {plan.superfiles_to_rewrite} superfiles "
          f"({plan.rows_to_rewrite} rows, {plan.deleted_rows_to_reclaim} deleted rows "
          f"reclaimed, {plan.cells_to_split} cells split) in {len(plan.groups)} groups "
          f"-> version {table.version}", flush=True)
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pipelines.optimize_supertable``: runs the job; returns the exit status."""
    return job_main(run, argv, PROG)


if __name__ == "__main__":
    raise SystemExit(main())
