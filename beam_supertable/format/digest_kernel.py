"""The row digest's hash of float lists (vectors), in one compiled pass.

:mod:`beam_supertable.format.digest` hashes a list of floats as the
polynomial hash of its elements' hashes, each a float's bits (widened to
float64) through the splitmix64 finalizer. In numpy that is a dozen passes
over temporaries as large as the vectors; here it is one pass, the same
uint64 arithmetic (wrapping modulo 2^64), so the digest is bit for bit the
same. Imported on first use (numba's import costs more than a small table's
digest).
"""

from __future__ import annotations

import numpy as np

from beam_supertable.vector import kernels as _cache   # noqa: F401  (numba's cache folder)

import numba  # noqa: E402

_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_P = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(nogil=True, cache=True)
def _float_lists(values, offsets, c1, c2, p, out):  # pragma: no cover  (compiled)
    wide = np.empty(1, np.float64)
    bits = wide.view(np.uint64)
    one = np.uint64(1)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    for i in range(len(offsets) - 1):
        h = np.uint64(0)
        power = one
        for j in range(offsets[i], offsets[i + 1]):
            wide[0] = values[j]
            x = bits[0]
            x = (x ^ (x >> s30)) * c1
            x = (x ^ (x >> s27)) * c2
            x = x ^ (x >> s31)
            h += (x + one) * power
            power *= p
        n = np.uint64(offsets[i + 1] - offsets[i]) + p
        n = (n ^ (n >> s30)) * c1
        n = (n ^ (n >> s27)) * c2
        out[i] = h ^ (n ^ (n >> s31))


def float_lists(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per list ``values[offsets[i]:offsets[i+1]]`` (float32 or float64, no nulls):
    what ``digest._segment_hash`` returns for its elements' float hashes."""
    out = np.empty(len(offsets) - 1, dtype=np.uint64)
    _float_lists(values, offsets.astype(np.int64), _C1, _C2, _P, out)
    return out
