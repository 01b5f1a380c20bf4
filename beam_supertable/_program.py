"""The name a command was started by, for its usage, version and error lines."""

from __future__ import annotations

import os
import sys

__all__ = ["program_name"]


def program_name(module_form: str) -> str:
    """``beam-supertable-load`` when started by that console script, else ``module_form``.

    An installed package has no ``pipelines`` package, so a console script's
    messages must not tell its user to run ``python -m pipelines.<job>``.
    """
    started_as = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return started_as if started_as.startswith(("beam-supertable", "beam-upsert")) else module_form
