"""Utilities for testing pipelines that write supertables and changelogs.

* :func:`temporary_table`: a throwaway table location (``memory://`` or a
  temporary directory), removed on exit.
* :func:`table_rows_equal` (an ``assert_that`` matcher) and
  :func:`assert_table_rows`: a table's live rows against the expected ones.
* :func:`changelog_equals`: a ``beam_upsert`` changelog against the expected
  changes, net per key.
* :func:`upsert_stream`: a ``TestStream`` of upsert commands with watermark
  and processing-time steps.
* :class:`FailFirstAttempt`: an ``on_stage`` hook for ``WriteToSupertable``
  that fails the first attempt of each stage it names, after that stage's
  side effects, so a test can check that the runner's retry (or a rerun of
  the job) neither loses nor doubles a row.

It sits beside the transforms (:mod:`.tables` and :mod:`.diff` check tables and
changelogs, :mod:`.stream` builds ``TestStream`` s) and imports the table, the
transforms and ``beam_upsert``; nothing of the package imports it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, Union

from beam_supertable.testing.stream import UpsertStream, upsert_stream
from beam_supertable.testing.tables import (
    assert_table_rows, changelog_equals, table_rows_equal, temporary_table)

__all__ = ["FailFirstAttempt", "UpsertStream", "assert_table_rows", "changelog_equals",
           "table_rows_equal", "temporary_table", "upsert_stream"]

STAGES = ("build", "commit")


class FailFirstAttempt:
    """Fails the first attempt of each named stage, once per (stage, key).

    Each failure is remembered by a marker file ``<stage>-<sha256(key)>`` in
    ``folder``, created atomically, so every worker process of a job (and
    every rerun) agrees that it happened, whatever characters or length the
    key has.

    Example::

        hook = FailFirstAttempt(tmp_path, stages=("build", "commit"))
        rows | WriteToSupertable(uri, schema=schema, on_stage=hook)

    Args:
        folder: an existing directory every worker can write.
        stages: which of ``"build"`` and ``"commit"`` fail (a list, or one name).

    Raises:
        ValueError: an unknown stage, no stage, or a folder that is not a directory.
    """

    def __init__(self, folder: Union[str, os.PathLike],
                 stages: Iterable[str] = STAGES) -> None:
        self.folder = os.fspath(folder)
        self.stages = (stages,) if isinstance(stages, str) else tuple(stages)
        if not self.stages:
            raise ValueError(f"FailFirstAttempt: stages must name at least one of {STAGES}")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ValueError(f"FailFirstAttempt: unknown stage(s) {unknown}; "
                             f"the stages are {STAGES}")
        if not os.path.isdir(self.folder):
            raise ValueError(f"FailFirstAttempt: {self.folder!r} is not a directory")

    def __call__(self, stage: str, key: str) -> None:
        if stage not in self.stages:
            return
        digest = hashlib.sha256(str(key).encode("utf-8")).hexdigest()
        marker = os.path.join(self.folder, f"{stage}-{digest}")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        raise RuntimeError(f"injected failure: first attempt of {stage} {key}")
