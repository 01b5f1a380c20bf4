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
from typing import Any


def add_job_argument(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """``parser.add_argument(*flags, **kwargs)``, unless a flag is already there."""
    taken = getattr(parser, "_option_string_actions", {})  # argparse keeps no public index
    if any(flag in taken for flag in flags):
        return
    parser.add_argument(*flags, **kwargs)
