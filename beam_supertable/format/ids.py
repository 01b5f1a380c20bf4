"""Row ids: unique across writers, processes and retries, by construction.

An ``_id`` is an int64 (the sign bit stays clear) made of three fields::

    | 23-bit claim | 20-bit block in the claim | 20-bit row in the block |

A writing process claims a claim number in a table by creating the object
``_supertable/ids/<claim:06x>.json`` with the store's atomic create-if-absent;
whoever creates it owns every id under it, so two processes can never hand
out the same id (a lost create just tries the next number). The process then
hands out the claim's 2^20 blocks of 2^20 rows in order, from any thread, and
claims again when they run out, after a ``fork``, or when its claim object is
gone (the table was deleted and created again); each call checks the latter
with one ``head``. A claim is one small
object per writing process and table; ``vacuum`` never removes claims,
because the ids they cover may be in use. Ids do not depend on the commit, so
a retried or rebased commit keeps them, and rewriting a superfile
(``ids=...``) keeps its rows' ids.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import socket
import threading
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from beam_supertable.errors import AlreadyExists, SupertableError
from beam_supertable.format.store import ObjectStore

__all__ = ["IdAllocator", "allocator_for", "claim_path", "new_ids"]

ROW_BITS = 20
BLOCK_BITS = 43                  # claim bits + sequence bits
CLAIM_BITS = 23
SEQUENCE_BITS = BLOCK_BITS - CLAIM_BITS
ROWS_PER_BLOCK = 1 << ROW_BITS
CLAIMS = "_supertable/ids"


def claim_path(claim: int) -> str:
    return f"{CLAIMS}/{claim:06x}.json"


class IdAllocator:
    """Hands out ``_id`` s of one table from claims this process made (thread-safe).

    Args:
        store: the table's store; claims are objects in it.
        draw: ``draw(bits)`` -> where to start looking for a free claim
            (default: ``secrets.randbits``). Any source is correct, even a
            constant: a taken claim makes the allocator try the next number.
    """

    def __init__(self, store: ObjectStore, *,
                 draw: Optional[Callable[[int], int]] = None) -> None:
        self._store = store
        self._draw = draw
        self._lock = threading.Lock()
        self._claim: Optional[int] = None
        self._pid: Optional[int] = None
        self._next = 0

    def new_ids(self, n: int) -> np.ndarray:
        """``n`` fresh ids, ascending within each block of 2^20 rows."""
        claim = self._claim
        if claim is not None and not self._store.exists(claim_path(claim)):
            # The table was deleted and created again under the same root:
            # the claim is no longer ours.
            with self._lock:
                if self._claim == claim:
                    self._claim = None
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, ROWS_PER_BLOCK):
            count = min(ROWS_PER_BLOCK, n - start)
            out[start:start + count] = (self._block() << ROW_BITS) + np.arange(count,
                                                                                dtype=np.int64)
        return out

    @property
    def claim(self) -> Optional[int]:
        """The claim blocks currently come from (None before the first id)."""
        return self._claim

    def _block(self) -> int:
        with self._lock:
            # A forked child inherits the parent's claim and position: it
            # must not hand out the blocks the parent goes on handing out.
            if self._claim is None or self._pid != os.getpid() or \
                    self._next >= 1 << SEQUENCE_BITS:
                self._claim, self._pid, self._next = self._new_claim(), os.getpid(), 0
            block = (self._claim << SEQUENCE_BITS) | self._next
            self._next += 1
            return block

    def _new_claim(self) -> int:
        draw = self._draw or secrets.randbits
        start = draw(CLAIM_BITS) % (1 << CLAIM_BITS)
        record = json.dumps({
            "writer": f"{socket.gethostname()}:{os.getpid()}",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }).encode()
        for step in range(1 << CLAIM_BITS):
            claim = (start + step) % (1 << CLAIM_BITS)
            try:
                self._store.put_if_absent(claim_path(claim), record)
                return claim
            except AlreadyExists:
                continue
        raise SupertableError(f"{self._store.uri}: every one of the {1 << CLAIM_BITS:,} id "
                              "claims is taken; the table cannot take more writers")


_ALLOCATORS: Dict[Tuple[str, str], IdAllocator] = {}
_ALLOCATORS_LOCK = threading.Lock()


def allocator_for(store: ObjectStore) -> IdAllocator:
    """The process-wide allocator of the table at ``store``'s root."""
    key = (store.protocol, store.root)
    with _ALLOCATORS_LOCK:
        allocator = _ALLOCATORS.get(key)
        if allocator is None:
            allocator = _ALLOCATORS[key] = IdAllocator(store)
        return allocator


def new_ids(store: ObjectStore, n: int) -> np.ndarray:
    """``n`` fresh ids for the table at ``store``'s root."""
    return allocator_for(store).new_ids(n)
