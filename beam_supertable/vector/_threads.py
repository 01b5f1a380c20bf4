"""The search thread pool and BLAS thread control, one per process."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, List, Optional, TypeVar

SEARCH_THREADS = os.cpu_count() or 2
READS_IN_FLIGHT = 8   # reads of one superfile sent at once to a remote store
_T, _R = TypeVar("_T"), TypeVar("_R")


def read_all(read: Callable[[_T], _R], items: Iterable[_T], together: bool) -> List[_R]:
    """``[read(i) for i in items]``; with ``together`` (each read a network round trip),
    up to ``READS_IN_FLIGHT`` at once, so a cold read waits for one round trip, not one
    per item. Local reads stay on the caller's thread (threads cost more than they do)."""
    items = list(items)
    if len(items) < 2 or not together:
        return [read(item) for item in items]
    with ThreadPoolExecutor(min(READS_IN_FLIGHT, len(items))) as pool:
        return list(pool.map(read, items))


_POOL: Optional[ThreadPoolExecutor] = None
_BLAS = None
_BLAS_LIBS = None   # the BLAS libraries' controllers (one_blas_thread)
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The search threads: made once per process."""
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=SEARCH_THREADS,
                                           thread_name_prefix="supertable-search")
    return _POOL


def blas_controller():
    """The process's ``threadpoolctl`` controller (finding the BLAS libraries is slow: once)."""
    global _BLAS
    if _BLAS is None:
        with _POOL_LOCK:
            if _BLAS is None:
                from threadpoolctl import ThreadpoolController
                _BLAS = ThreadpoolController()
    return _BLAS


@contextlib.contextmanager
def one_blas_thread():
    """A context in which BLAS runs on the calling thread only.

    For the many small products of a search: a BLAS thread woken for each
    of them waits for a core (and the caller for it) on a busy machine.
    Sets the BLAS libraries' thread counts directly (a few microseconds;
    ``threadpoolctl``'s ``limit`` re-inspects every library each time).
    (OpenBLAS 0.3.31 ignores a count set from another thread once the main
    thread has set one: there this costs speed, never an answer.)
    """
    global _BLAS_LIBS
    if _BLAS_LIBS is None:
        _BLAS_LIBS = blas_controller().select(user_api="blas").lib_controllers
    saved = [(lib, lib.get_num_threads()) for lib in _BLAS_LIBS]
    for lib, n in saved:
        if n != 1:
            lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in saved:
            if n != 1:
                lib.set_num_threads(n)
