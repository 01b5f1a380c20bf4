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

At exit the queue is drained (up to ``EXIT_WAIT_S``) before
:mod:`concurrent.futures` starts refusing work, which the stores' clients use
too. A forked child starts with an empty queue of its own.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import concurrent.futures.thread
import logging
import os
import threading
from typing import Callable, Dict, List, Optional, Tuple

__all__ = ["EXIT_WAIT_S", "drain", "submit", "wait"]

EXIT_WAIT_S = 120.0

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()
_STATE: Dict[str, object] = {"pid": None, "pool": None}
# table key -> (queued write, what it writes)
_PENDING: Dict[str, List[Tuple[concurrent.futures.Future, str]]] = {}
_WORKER = threading.local()        # set inside the writer thread


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    with _LOCK:
        if _STATE["pid"] != os.getpid():
            _STATE["pid"] = os.getpid()
            _STATE["pool"] = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="iceberg-metadata",
                initializer=_mark_worker)
            _PENDING.clear()
        return _STATE["pool"]  # type: ignore[return-value]


def _mark_worker() -> None:
    _WORKER.active = True


def submit(key: str, write: Callable[[], None], what: str = "") -> None:
    """Queues ``write`` (``what``: the metadata of a version of the table ``key`` names)."""
    pool = _pool()
    try:
        future = pool.submit(write)
    except RuntimeError:
        # The interpreter is exiting and takes no new work: write it here.
        write()
        return
    with _LOCK:
        _PENDING.setdefault(key, []).append((future, what))
    future.add_done_callback(lambda done: _forget(key, done))


def _forget(key: str, done: concurrent.futures.Future) -> None:
    with _LOCK:
        queued = _PENDING.get(key)
        if queued is None:
            return
        queued[:] = [(f, what) for f, what in queued if f is not done]
        if not queued:
            del _PENDING[key]


def _queued(key: Optional[str]) -> List[Tuple[concurrent.futures.Future, str]]:
    with _LOCK:
        if key is None:
            return [item for queued in _PENDING.values() for item in queued]
        return list(_PENDING.get(key, ()))


def wait(key: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """Returns once the metadata this process queued (for the table ``key`` names, or
    for every table) is written; at once inside the writer thread itself."""
    if getattr(_WORKER, "active", False) or _STATE["pid"] != os.getpid():
        return
    queued = _queued(key)
    if queued:
        concurrent.futures.wait([f for f, _ in queued], timeout=timeout)


def drain(timeout: Optional[float] = None) -> None:
    """Waits for every table's queued metadata (before timing, or handing a table over)."""
    wait(None, timeout)


def _at_exit() -> None:
    drain(EXIT_WAIT_S)
    left = [what for f, what in _queued(None) if not f.done()]
    if left:
        _LOG.warning("exiting with the Iceberg metadata of %d version(s) unwritten (%s); the "
                     "next iceberg_metadata_location() or `beam-supertable iceberg sync` "
                     "writes it", len(left), "; ".join(left[:5]))


def _after_fork_in_child() -> None:
    # The parent's lock may be held and its thread is not here: start afresh.
    global _LOCK
    _LOCK = threading.Lock()
    _STATE["pid"], _STATE["pool"] = None, None
    _PENDING.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
# threading's exit callbacks run last first, and concurrent.futures registered its
# own (which stops every executor taking work) when it was imported above.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_at_exit)
else:   # pragma: no cover - an interpreter without it
    atexit.register(_at_exit)
