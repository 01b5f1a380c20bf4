"""Job options that several jobs can share in one process.

Beam parses every ``PipelineOptions`` subclass defined in the process with
one argparse parser (``get_all_options``, which running a pipeline calls), so
two jobs that both define ``--output`` fail with "conflicting option string"
as soon as both modules are imported. Each job's own view still parses with
its own class alone, so a flag another job already registered can simply be
skipped in the shared parser: every job declares its flags through
``add_job_argument``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import flink


def add_job_argument(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """``parser.add_argument(*flags, **kwargs)``, unless a flag is already there."""
    taken = getattr(parser, "_option_string_actions", {})  # argparse keeps no public index
    if any(flag in taken for flag in flags):
        return
    parser.add_argument(*flags, **kwargs)


def job_options(argv: List[str], options_class: type, prog: str, doc: Optional[str],
                raw_description: bool = False) -> Tuple[PipelineOptions, Any]:
    """Parses a job's command line: ``--help`` lists the job's own options.

    Returns:
        ``(options, job)``: the pipeline options (Flink defaults filled in) and
        their view as ``options_class``.
    """
    # PipelineOptions alone would list only Beam's options under --help.
    parser = argparse.ArgumentParser(
        prog=prog, description=doc,
        formatter_class=(argparse.RawDescriptionHelpFormatter if raw_description
                         else argparse.HelpFormatter),
        epilog="Any Beam pipeline option (--runner, --flink_master, ...) is accepted too.")
    options_class._add_argparse_args(parser)  # noqa: SLF001 (Beam's documented hook)
    parser.parse_known_args(argv)
    options = flink.fill_defaults(PipelineOptions(argv), argv)
    return options, options.view_as(options_class)


def counter_totals(result: Any, namespaces: Iterable[str]) -> Dict[str, int]:
    """The job's counters in ``namespaces``, by name (committed where the runner has them)."""
    wanted = set(namespaces)
    got: Dict[str, int] = {}
    for c in result.metrics().query()["counters"]:
        if c.key.metric.namespace not in wanted:
            continue
        value = c.committed if c.committed is not None else c.attempted
        got[c.key.metric.name] = got.get(c.key.metric.name, 0) + (value or 0)
    return got


def split_columns(spec: Optional[str]) -> List[str]:
    """``"a, b"`` -> ``["a", "b"]``; None or empty -> ``[]``."""
    return [c.strip() for c in spec.split(",") if c.strip()] if spec else []


def dead_letters_path(table: str, given: Optional[str], job_name: str) -> str:
    """Where a job writes its dead letters: ``given``, else beside a local table,
    else ``out/<job_name>.invalid.jsonl``."""
    if given:
        return given
    if "://" not in table:
        return table.rstrip("/\\") + ".invalid.jsonl"
    return os.path.join("out", f"{job_name}.invalid.jsonl")


def local_parents(*paths: Optional[str]) -> None:
    """Creates the folders that local ``paths`` will be written into (URIs are left alone)."""
    for path in paths:
        if path and "://" not in path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def run_pipeline(options: PipelineOptions, build: Callable[..., Any], *args: Any) -> Any:
    """Builds a job's pipeline with ``build(pipeline, *args)`` and runs it to the end.

    Returns:
        The finished ``PipelineResult`` (its counters for the job's summary).
    """
    p = beam.Pipeline(options=options)
    build(p, *args)
    result = p.run()
    result.wait_until_finish()
    return result


def job_argv(argv: Optional[List[str]]) -> List[str]:
    """The job's arguments: ``argv``, or the command line's."""
    return list(sys.argv[1:] if argv is None else argv)


def main(run: Callable[[], Any]) -> None:
    """A job's ``python -m`` entry point: the SDK's INFO logging off, then ``run()``."""
    logging.getLogger().setLevel(logging.WARNING)
    run()
