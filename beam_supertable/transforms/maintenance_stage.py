"""Maintenance that runs itself behind a streaming writer: compaction when the
small-file debt passes a threshold, and vacuum on a schedule.

A step after the commit step of ``WriteToSupertable`` and ``UpsertToSupertable``
(``auto_compact``, ``vacuum_every``): it passes every ``CommitResult`` on
unchanged and, after each, looks at the latest version. When the superfiles
under half the table's target size (``optimize``'s "small") number
``auto_compact`` or more, it runs ``Supertable.optimize``; when ``vacuum_every``
has passed since its last vacuum, ``Supertable.vacuum``. Both run on one
background thread, so a commit never waits for them; only when compaction
falls a whole threshold behind (twice ``auto_compact`` small superfiles)
does the step wait for the running job, which bounds the debt. They rely on
the concurrency ``optimize`` and ``vacuum`` already give: commits landing
during an optimize never conflict (deletes and upserts on rewritten
superfiles are carried over), and vacuum's grace period protects the
superfiles of commits in flight. A failed job is logged and counted
(``beam_supertable/maintenance_failures``), never fails the pipeline: the
next threshold or schedule tries again. The schedule and the running job
are per process and table (``maintainer``), so a runner making a new
instance of the step per bundle neither loses them nor starts a second job.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Optional, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_supertable.format.vacuum import grace_seconds
from beam_supertable.format.writer import TARGET_SUPERFILE_BYTES
from beam_supertable.table.optimize_plan import SMALL_FILE_SHARE
from beam_supertable.table.supertable import Supertable

NAMESPACE = "beam_supertable"
DEFAULT_AUTO_COMPACT_SUPERFILES = 64

_LOG = logging.getLogger(__name__)


def check_maintenance(who: str, auto_compact, vacuum_every, vacuum_retain_versions,
                      vacuum_older_than) -> tuple:
    """The maintenance options checked; ``(compact_at, vacuum_every_s, retain, grace_s)``.

    ``auto_compact``: None/False (off), True (``DEFAULT_AUTO_COMPACT_SUPERFILES``)
    or a count of small superfiles >= 2. ``vacuum_every``: None (off), seconds > 0
    or a ``timedelta``.
    """
    if auto_compact is None or auto_compact is False:
        compact_at = None
    elif auto_compact is True:
        compact_at = DEFAULT_AUTO_COMPACT_SUPERFILES
    elif isinstance(auto_compact, int) and auto_compact >= 2:
        compact_at = auto_compact
    else:
        raise ValueError(f"{who}: auto_compact must be True, False, None or a count of small "
                         f"superfiles >= 2, got {auto_compact!r}")
    every = vacuum_every
    if isinstance(every, datetime.timedelta):
        every = every.total_seconds()
    if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float))
                              or not 0 < every < math.inf):
        raise ValueError(f"{who}: vacuum_every must be a finite number of seconds > 0, a timedelta or None, "
                         f"got {vacuum_every!r}")
    if isinstance(vacuum_retain_versions, bool) or not isinstance(vacuum_retain_versions, int) \
            or vacuum_retain_versions < 1:
        raise ValueError(f"{who}: vacuum_retain_versions must be an int >= 1, "
                         f"got {vacuum_retain_versions!r}")
    try:
        grace = grace_seconds(vacuum_older_than)
    except ValueError:
        raise ValueError(f"{who}: vacuum_older_than must be seconds >= 0, a timedelta or "
                         f"None, got {vacuum_older_than!r}") from None
    return compact_at, None if every is None else float(every), vacuum_retain_versions, grace


def small_superfiles(table: Supertable) -> int:
    """How many superfiles of ``table``'s version are "small" for ``optimize``."""
    target = int(table.properties.get("target_superfile_bytes", TARGET_SUPERFILE_BYTES))
    limit = SMALL_FILE_SHARE * target
    return sum(1 for e in table.superfiles() if (e.get("bytes") or 0) < limit)


class _Maintainer:
    """One table's background maintenance in this process: one job at a time.

    Shared by every instance of the step in the process (a runner may make a
    new instance per bundle), so the schedule and the running job survive
    them; its worker thread is not tied to any bundle.
    """

    def __init__(self, uri: str, options: Optional[dict]) -> None:
        self.uri, self.options = uri, options
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="supertable-maintenance")
        self.job: Optional[Future] = None
        self.last_vacuum = time.monotonic()

    def debt(self) -> int:
        # A fresh handle each time: a handle kept for the life of a streaming job
        # would keep every manifest part it ever read.
        return small_superfiles(Supertable.open(self.uri, storage_options=self.options,
                                                cache_bytes=0))

    def settle(self, wait: bool, failures=None) -> bool:
        """Whether no job runs (after collecting a finished one's outcome)."""
        job = self.job
        if job is None:
            return True
        if not wait and not job.done():
            return False
        self.job = None
        exc = job.exception()
        if exc is not None:
            if failures is not None:
                failures.inc()
            _LOG.warning("%s: background maintenance failed (tried again later): %s",
                         self.uri, exc)
        return True


_MAINTAINERS: Dict[str, _Maintainer] = {}
_REGISTRY_LOCK = threading.Lock()


def maintainer(uri: str, options: Optional[dict]) -> _Maintainer:
    """This process's maintainer of the table at ``uri``."""
    key = json.dumps([uri, options], sort_keys=True, default=str)
    with _REGISTRY_LOCK:
        found = _MAINTAINERS.get(key)
        if found is None:
            found = _MAINTAINERS[key] = _Maintainer(uri, options)
        return found


def wait_for_maintenance(uri: str, options: Optional[dict] = None) -> None:
    """Waits until this process runs no maintenance job on ``uri`` (for tests and
    for a caller about to read the table's final state)."""
    found = maintainer(uri, options)
    with found.lock:
        found.settle(wait=True)


class _Maintain(beam.DoFn):
    """Passes commit results on; compacts and vacuums the table behind them."""

    def __init__(self, uri: str, storage_options: Optional[dict], compact_at: Optional[int],
                 vacuum_every_s: Optional[float], retain_versions: int,
                 grace_s: Union[float, None]) -> None:
        self._uri, self._options = uri, storage_options
        self._compact_at, self._every = compact_at, vacuum_every_s
        self._retain, self._grace = retain_versions, grace_s

    def setup(self):
        self._compactions = Metrics.counter(NAMESPACE, "auto_compactions")
        self._vacuums = Metrics.counter(NAMESPACE, "scheduled_vacuums")
        self._failures = Metrics.counter(NAMESPACE, "maintenance_failures")

    def process(self, result):
        yield result
        self._tick()

    def _tick(self) -> None:
        m = maintainer(self._uri, self._options)
        with m.lock:
            if not m.settle(False, self._failures):
                if self._compact_at is not None and m.debt() >= 2 * self._compact_at:
                    m.settle(True, self._failures)   # compaction fell a whole threshold behind
                else:
                    return
            if self._compact_at is not None and m.debt() >= self._compact_at:
                self._compactions.inc()
                m.job = m.pool.submit(self._compact)
            elif self._every is not None and time.monotonic() - m.last_vacuum >= self._every:
                m.last_vacuum = time.monotonic()
                self._vacuums.inc()
                m.job = m.pool.submit(self._vacuum)

    def _handle(self) -> Supertable:
        return Supertable.open(self._uri, storage_options=self._options, cache_bytes=0)

    def _compact(self) -> None:
        table = self._handle()
        target = int(table.properties.get("target_superfile_bytes", TARGET_SUPERFILE_BYTES))
        table.optimize(target_file_bytes=target)

    def _vacuum(self) -> None:
        table = self._handle()
        # A streaming upsert run reads priors at the version it started on
        # (its commits record it): that version stays, however old.
        starts = [h["metadata"]["start_version"] for h in table.history()
                  if isinstance(h.get("metadata"), dict)
                  and isinstance(h["metadata"].get("start_version"), int)]
        table.vacuum(retain_versions=self._retain, older_than=self._grace,
                     keep_versions=starts[-1:])
