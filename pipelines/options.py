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
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

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
