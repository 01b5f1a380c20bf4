"""SQ8 codes for scoring and 1-bit codes for shortlists.

SQ8: per superfile and dimension, ``code = round((x - lo) / (hi - lo) * 255)``.
1-bit: the sign of each dimension of the residual to the row's fine centroid,
packed 8 per byte (``numpy.packbits`` order); the Hamming distance between a
query's and a row's residual signs ranks rows by angle around that centroid.
"""

from __future__ import annotations

import numpy as np

_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def sq8_params(x: np.ndarray) -> np.ndarray:
    lo = x.min(axis=0)
    hi = x.max(axis=0)
    return np.stack([lo, np.where(hi > lo, (hi - lo) / 255.0, 1.0)]).astype(np.float32)


def sq8_encode(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    # In place in one temporary: each step was a fresh array the size of the vectors.
    q = np.subtract(x, params[0])
    np.divide(q, params[1], out=q)
    np.rint(q, out=q)
    np.clip(q, 0, 255, out=q)
    return q.astype(np.uint8)


def sq8_decode(codes: np.ndarray, params: np.ndarray) -> np.ndarray:
    return codes.astype(np.float32) * params[1] + params[0]


def bits_encode(residuals: np.ndarray) -> np.ndarray:
    return np.packbits(residuals > 0, axis=1)


def hamming(query_bits: np.ndarray, row_bits: np.ndarray) -> np.ndarray:
    """Hamming distance of one packed query code to each packed row code."""
    return _POPCOUNT[np.bitwise_xor(row_bits, query_bits[None, :])].sum(axis=1, dtype=np.int32)
