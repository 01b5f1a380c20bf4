"""The jobs' entry points: quiet imports, then the job's ``main``.

apache-beam logs housekeeping at import time (``Failed to import
GCSFileSystem``, ``apitools not found``) before any job code runs, so the
console scripts and ``python -m pipelines.<job>`` start here: this module
imports nothing of Beam, hides those messages unless ``--verbose`` is on the
command line, and only then imports the job.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from typing import List, Optional

__all__ = ["launch", "quiet_logging"]

# Loggers whose import-time and housekeeping messages (a missing optional
# filesystem, WriteToText's "Deleting 1 existing files") are not the user's
# business unless they ask with --verbose.
NOISY_LOGGERS = ("apache_beam", "fsspec", "s3fs", "botocore", "aiobotocore", "urllib3",
                 "google", "absl")
# Messages apache-beam logs on the root logger while it imports.
_ROOT_NOISE = ("apitools not found",)
# Warnings third parties raise at import time about the environment, not the job:
# google-api-core (imported by Beam's Enrichment) on the Python version's end of life.
_IMPORT_WARNINGS = (("You are using a Python version", FutureWarning, r"google\.api_core"),)


class _DropRootNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and str(record.msg).startswith(_ROOT_NOISE))


def quiet_logging(verbose: bool = False) -> None:
    """Our warnings on stderr as ``WARNING name: message``; third parties' only when verbose.

    The project's own loggers (``beam_supertable``, ``beam_upsert``) stay at
    WARNING: a deduplicated commit or a dropped late command is always shown.
    """
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for handler in root.handlers:
        if not any(isinstance(f, _DropRootNoise) for f in handler.filters) and not verbose:
            handler.addFilter(_DropRootNoise())
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.CRITICAL)
    for name in ("beam_supertable", "beam_upsert"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        for message, category, module in _IMPORT_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)


def launch(job: str, argv: Optional[List[str]] = None) -> int:
    """Runs ``beam_supertable.jobs.<job>``'s ``main(argv)``; returns its exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    quiet_logging(verbose=bool({"--verbose", "--debug", "--verbose=true", "--debug=true"}
                               & set(args)))
    module = importlib.import_module(f"beam_supertable.jobs.{job}")
    return module.main(args)


def upsert_to_supertable() -> int:
    """Console script ``beam-supertable-upsert``."""
    return launch("upsert_to_supertable")


def load_supertable() -> int:
    """Console script ``beam-supertable-load``."""
    return launch("load_supertable")


def search_supertable() -> int:
    """Console script ``beam-supertable-search``."""
    return launch("search_supertable")


def optimize_supertable() -> int:
    """Console script ``beam-supertable-optimize``."""
    return launch("optimize_supertable")


def upsert_changes() -> int:
    """Console script ``beam-upsert-changes``."""
    return launch("upsert_changes")
