"""Row ids: unique across writers and retries without coordination.

An ``_id`` is an int64 made of a random 43-bit block number and a 20-bit row
offset inside the block (the sign bit stays clear). A writer draws a fresh
block for every 2^20 rows it writes, so two writers share an id only if they
draw the same block: about 0.06% for 10^5 blocks (10^11 rows) in one table
(``collision_probability``).
"""

from __future__ import annotations

import secrets

import numpy as np

ROW_BITS = 20
BLOCK_BITS = 43
ROWS_PER_BLOCK = 1 << ROW_BITS


def new_ids(n: int) -> np.ndarray:
    """``n`` fresh ids, ascending, in as few random blocks as fit."""
    out = np.empty(n, dtype=np.int64)
    for start in range(0, n, ROWS_PER_BLOCK):
        count = min(ROWS_PER_BLOCK, n - start)
        block = secrets.randbits(BLOCK_BITS)
        out[start:start + count] = (block << ROW_BITS) + np.arange(count, dtype=np.int64)
    return out


def collision_probability(blocks: int) -> float:
    """Birthday bound for ``blocks`` random blocks in the table."""
    return blocks * (blocks - 1) / 2 / float(1 << BLOCK_BITS)
