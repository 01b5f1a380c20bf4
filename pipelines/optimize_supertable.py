"""Templated batch job: optimize a supertable, rewriting in parallel workers.

The same operation as ``Supertable.optimize`` (see ``beam_supertable.optimize``),
split the way a cluster runs it: the launcher plans on the table's latest
version (``plan_optimize``: groups of superfiles per cell range), the groups
are spread over the workers (``Reshuffle``), each worker rewrites its groups
(``rewrite_group``), and one step commits every new superfile at once
(``commit_optimize``), with an idempotency token derived from the plan: a
retried commit lands once, and a rerun of the job plans on the optimized
table and finds nothing to do. Appends, deletes and upserts landing while the
job runs are kept (deletes carried over by ``_id``).

Run ``python -m pipelines.optimize_supertable --help`` for the options; any
Beam option (``--runner=FlinkRunner`` ...) is accepted too.
"""

from __future__ import annotations

import json
from typing import List, Optional

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from beam_supertable import Supertable
from beam_supertable.optimize import (
    DEFAULT_TARGET_FILE_BYTES, OptimizePlan, commit_optimize, plan_optimize, rewrite_group)
from pipelines.io_formats import JOB_NAMESPACE
from pipelines.options import (
    add_job_argument, counter_totals, job_argv, job_options, main,
    run_pipeline)


class OptimizeSupertableOptions(PipelineOptions):
    """Options of the optimize_supertable job (those of ``Supertable.optimize``)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_job_argument(parser, "--table", required=False, default=None,
                         help="The supertable to optimize (local path, memory://, s3://...).")
        add_job_argument(
            parser, "--target-file-bytes", "--target_file_bytes", dest="target_file_bytes",
            type=int, default=DEFAULT_TARGET_FILE_BYTES,
            help="Size rewritten superfiles aim at (default: %(default)s).")
        add_job_argument(
            parser, "--max-cell-rows", "--max_cell_rows", dest="max_cell_rows", type=int,
            default=None, help="Split cells holding more live rows (default: "
                               "max(256, 2*sqrt(live rows))).")
        add_job_argument(
            parser, "--max-rewrite-bytes", "--max_rewrite_bytes", dest="max_rewrite_bytes",
            type=int, default=None, help="Rewrite at most about this many bytes (default: all).")
        add_job_argument(parser, "--dry-run", "--dry_run", dest="dry_run", action="store_true",
                         help="Print the plan as JSON; write nothing.")


class _Rewrite(beam.DoFn):
    """A group number -> the entries of the superfiles it was rewritten into."""

    def __init__(self, uri: str, plan: OptimizePlan):
        self._uri, self._plan = uri, plan

    def setup(self):
        self._table = Supertable.open(self._uri, version=self._plan.version)
        self._groups = Metrics.counter(JOB_NAMESPACE, "groups_rewritten")
        self._rows = Metrics.counter(JOB_NAMESPACE, "rows_rewritten")

    def process(self, number: int):
        entries = rewrite_group(self._table, self._plan, self._plan.groups[number])
        self._groups.inc()
        self._rows.inc(sum(e["rows"] for e in entries))
        yield from entries


class _Commit(beam.DoFn):
    """Every group's entries -> one commit; yields the version holding it."""

    def __init__(self, uri: str, plan: OptimizePlan):
        self._uri, self._plan = uri, plan

    def process(self, entries: List[dict]):
        table = Supertable.open(self._uri)
        version = commit_optimize(table, self._plan, entries)
        Metrics.counter(JOB_NAMESPACE, "commits").inc(0 if table.snapshot.deduplicated else 1)
        yield version


def build(p: beam.Pipeline, uri: str, plan: OptimizePlan) -> beam.PCollection:
    """The rewrite and commit of ``plan``; returns a PCollection of the one version."""
    return (p
            | "Groups" >> beam.Create(list(range(len(plan.groups))))
            | "Spread" >> beam.Reshuffle()
            | "Rewrite" >> beam.ParDo(_Rewrite(uri, plan))
            | "Gather" >> beam.combiners.ToList()
            | "Commit" >> beam.ParDo(_Commit(uri, plan)))


def run(argv: Optional[List[str]] = None) -> dict:
    """Runs the job; returns ``{"version": ..., "plan": ...}`` (version None: nothing to do)."""
    options, job = job_options(job_argv(argv), OptimizeSupertableOptions,
                               "python -m pipelines.optimize_supertable", __doc__,
                               raw_description=True)
    if not job.table:
        raise SystemExit("optimize_supertable: --table is required")
    table = Supertable.open(job.table)
    plan = plan_optimize(table, target_file_bytes=job.target_file_bytes,
                         max_cell_rows=job.max_cell_rows, max_rewrite_bytes=job.max_rewrite_bytes)
    summary = {"plan": plan.to_dict(), "version": None}
    if job.dry_run or plan.empty:
        print(f"optimize_supertable: {'dry run' if job.dry_run else 'nothing to do'}: "
              f"{json.dumps({k: v for k, v in plan.to_dict().items() if k != 'groups'})}")
        return summary
    result = run_pipeline(options, build, job.table, plan)
    table.refresh()
    summary["version"] = table.version
    summary["counters"] = counter_totals(result, (JOB_NAMESPACE,))
    print(f"optimize_supertable: rewrote {plan.superfiles_to_rewrite} superfiles "
          f"({plan.rows_to_rewrite} rows, {plan.deleted_rows_to_reclaim} deleted rows "
          f"reclaimed, {plan.cells_to_split} cells split) in {len(plan.groups)} groups "
          f"-> version {table.version}")
    return summary


if __name__ == "__main__":
    main(run)
