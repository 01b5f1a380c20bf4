"""The Iceberg metadata of a landed version, written beside the commit, not in it.

A commit is done when its version document is created: that is what every
writer races for and what our readers read. The Iceberg metadata of the
version (a manifest for a new part, the manifest list, the metadata file, the
version hint) is a function of the version, so it need not hold the writer up:
each process has one thread that writes it, in the order the versions landed
(the metadata of N+1 reuses N's manifest list, so order saves work, and one
thread never races itself).

Whoever reads a version's metadata through this process first waits for what
the process queued for that table (:func:`wait`); a reader in another process
finds it written, or writes it (each object is created atomically, and two
writers of one version write the same objects). A process that dies before its
thread is done leaves versions without metadata, which the next reader or
``beam-supertable iceberg sync`` writes, as after any crash between the two.

The thread is the one :mod:`concurrent.futures` keeps, so the interpreter
finishes what is queued before it exits.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Callable, Dict, List, Optional

__all__ = ["drain", "submit", "wait"]

_LOCK = threading.Lock()
_STATE: Dict[str, object] = {"pid": None, "pool": None}
_PENDING: Dict[str, List[concurrent.futures.Future]] = {}   # table uri -> queued writes
_WORKER = threading.local()        # set inside the writer thread


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    with _LOCK:
        if _STATE["pid"] != os.getpid():
            # A forked child inherits the parent's queue but not its thread.
            _STATE["pid"] = os.getpid()
            _STATE["pool"] = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="iceberg-metadata",
                initializer=_mark_worker)
            _PENDING.clear()
        return _STATE["pool"]  # type: ignore[return-value]


def _mark_worker() -> None:
    _WORKER.active = True


def submit(uri: str, write: Callable[[], None]) -> None:
    """Queues ``write`` (the metadata of a version of the table at ``uri``)."""
    pool = _pool()
    try:
        future = pool.submit(write)
    except RuntimeError:
        # The interpreter is exiting and takes no new work: write it here.
        write()
        return
    with _LOCK:
        _PENDING.setdefault(uri, []).append(future)
    future.add_done_callback(lambda done: _forget(uri, done))


def _forget(uri: str, done: concurrent.futures.Future) -> None:
    with _LOCK:
        queued = _PENDING.get(uri)
        if queued is not None and done in queued:
            queued.remove(done)
            if not queued:
                del _PENDING[uri]


def wait(uri: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """Returns once the metadata this process queued (for the table at ``uri``, or
    for every table) is written; at once inside the writer thread itself."""
    if getattr(_WORKER, "active", False) or _STATE["pid"] != os.getpid():
        return
    with _LOCK:
        if uri is None:
            futures = [f for queued in _PENDING.values() for f in queued]
        else:
            futures = list(_PENDING.get(uri, ()))
    if futures:
        concurrent.futures.wait(futures, timeout=timeout)


def drain(timeout: Optional[float] = None) -> None:
    """Waits for every table's queued metadata (before timing, or handing a table over)."""
    wait(None, timeout)
