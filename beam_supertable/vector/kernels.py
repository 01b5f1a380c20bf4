"""Compiled kernels (numba) for the search's cell scans and 1-bit shortlists.

Each kernel is compiled once per machine and kept on disk (``cache=True``):
under ``NUMBA_CACHE_DIR`` when the caller set it; else next to this file when
the package folder is writable; else ``NUMBA_CACHE_DIR`` is set here to a
user cache folder (``~/.cache/beam-supertable/numba``) or, when that cannot be
written either, to one under the temporary folder (:func:`cache_folder`). A
fresh worker therefore compiles once; later processes load the machine code.

Kernels release the GIL (``nogil``): the search's thread pool runs one per
core. They do not start threads of their own (numba's ``parallel`` layer
may not be entered from several threads at once).

- :func:`scan_topk`: scores every run's entries against the queries that
  probe it (``[q, 1] @ columns``: see ``search.scores``) and keeps, per query,
  its ``depth`` lowest scores in a bounded heap, across all its runs, in one
  call: no score block is ever materialized.
- :func:`hamming_topk`: each query's ``keep`` nearest packed 1-bit codes,
  ties going to the lower entry.
- :func:`kmeans_plusplus`: the grid training's seeds, scikit-learn's picks
  with the distance passes compiled.
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

import numpy as np


def cache_folder(environ, package_writable: bool) -> Optional[str]:
    """Where numba should cache (``NUMBA_CACHE_DIR``), or None to leave its choice.

    None when the caller set ``NUMBA_CACHE_DIR`` or numba can write beside the
    package; else the first writable of ``~/.cache/beam-supertable/numba`` and
    the temporary folder's ``beam-supertable/numba`` (made if missing).
    """
    if environ.get("NUMBA_CACHE_DIR") or package_writable:
        return None
    home = environ.get("HOME") or os.path.expanduser("~")
    for base in (os.path.join(home, ".cache"), tempfile.gettempdir()):
        path = os.path.join(base, "beam-supertable", "numba")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    return None


_FOLDER = cache_folder(os.environ, os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK))
if _FOLDER is not None:
    os.environ["NUMBA_CACHE_DIR"] = _FOLDER

import numba  # noqa: E402  (after the cache folder is chosen)

_JIT = dict(nogil=True, cache=True, fastmath=False, boundscheck=False)
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int32)


@numba.njit(**_JIT)
def _scan(aug, store, starts, stops, qptr, qids, heap_s, heap_e, heap_n):
    # Per query, a max-heap on (score, entry) of its ``depth`` best so far:
    # the worst kept candidate sits at 0. (One function: each compiled
    # function costs a fresh worker compile time.)
    depth = heap_s.shape[1]
    width = store.shape[0]
    longest = 0
    for r in range(len(starts)):
        longest = max(longest, stops[r] - starts[r])
    buf = np.empty(longest, dtype=np.float32)
    for r in range(len(starts)):
        a = starts[r]
        n = stops[r] - a
        for p in range(qptr[r], qptr[r + 1]):
            q = qids[p]
            for j in range(n):
                buf[j] = 0.0
            for d in range(width):
                w = aug[q, d]
                col = store[d, a:a + n]   # (a slice: indices from 0, so the loop vectorizes)
                for j in range(n):
                    buf[j] += w * col[j]
            hs = heap_s[q]
            he = heap_e[q]
            m = heap_n[q]
            for j in range(n):
                s = buf[j]
                e = a + j
                if m < depth:
                    i = m      # sift up
                    m += 1
                    while i > 0:
                        up = (i - 1) // 2
                        if hs[up] > s or (hs[up] == s and he[up] > e):
                            break
                        hs[i] = hs[up]
                        he[i] = he[up]
                        i = up
                    hs[i] = s
                    he[i] = e
                elif s < hs[0]:
                    _down(hs, he, depth, s, e)
            heap_n[q] = m
    # Heap sort: pop the worst to the end, so each row ascends.
    for q in range(len(heap_n)):
        hs = heap_s[q]
        he = heap_e[q]
        m = heap_n[q]
        while m > 1:
            m -= 1
            s, e = hs[m], he[m]
            hs[m] = hs[0]
            he[m] = he[0]
            _down(hs, he, m, s, e)


@numba.njit(**_JIT, inline="always")
def _down(hs, he, n, s, e):
    # Replaces the top of a max-heap of n entries by (s, e) and sifts it down.
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (hs[c + 1] > hs[c] or (hs[c + 1] == hs[c] and he[c + 1] > he[c])):
            c += 1
        if hs[c] < s or (hs[c] == s and he[c] < e):
            break
        hs[i] = hs[c]
        he[i] = he[c]
        i = c
    hs[i] = s
    he[i] = e


def scan_topk(aug: np.ndarray, store: np.ndarray, starts: np.ndarray, stops: np.ndarray,
              qptr: np.ndarray, qids: np.ndarray, depth: int):
    """Each query's ``depth`` lowest scores over the runs it probes.

    Args:
        aug: ``[queries, dim + 1]`` float32 augmented queries (``[q, 1]``).
        store: ``[dim + 1, entries]`` float32 scoring columns (C order).
        starts, stops: ``[runs]`` entry spans of the runs to scan.
        qptr, qids: the queries of run ``r`` are ``qids[qptr[r]:qptr[r + 1]]``.

    Returns:
        ``(scores, entries, counts)``: ``[queries, depth]`` float32 scores,
        ascending (ties: lower entry first), their int64 entries, and how
        many of each row are filled (the rest is unspecified).
    """
    n_q = len(aug)
    heap_s = np.empty((n_q, depth), dtype=np.float32)
    heap_e = np.empty((n_q, depth), dtype=np.int64)
    counts = np.zeros(n_q, dtype=np.int64)
    if depth > 0 and len(starts):
        _scan(np.ascontiguousarray(aug, dtype=np.float32), store,
              np.ascontiguousarray(starts, dtype=np.int64), np.ascontiguousarray(stops, dtype=np.int64),
              np.ascontiguousarray(qptr, dtype=np.int64), np.ascontiguousarray(qids, dtype=np.int64),
              heap_s, heap_e, counts)
    return heap_s, heap_e, counts


@numba.njit(**_JIT)
def _hamming(qbits, bits, keep, popcount, out):
    n = bits.shape[0]
    nb = bits.shape[1]
    ham = np.empty(n, dtype=np.int32)
    hist = np.empty(nb * 8 + 2, dtype=np.int64)
    for q in range(qbits.shape[0]):
        hist[:] = 0
        for i in range(n):
            h = 0
            for b in range(nb):
                h += popcount[bits[i, b] ^ qbits[q, b]]
            ham[i] = h
            hist[h] += 1
        # The smallest distance t whose running count reaches keep: every
        # row under t is kept, and the first rows at t fill the rest.
        total = 0
        t = 0
        while total + hist[t] < keep:
            total += hist[t]
            t += 1
        at_t = keep - total
        o = 0
        for i in range(n):
            h = ham[i]
            if h < t:
                out[q, o] = i
                o += 1
            elif h == t and at_t > 0:
                out[q, o] = i
                o += 1
                at_t -= 1


def hamming_topk(qbits: np.ndarray, bits: np.ndarray, keep: int) -> np.ndarray:
    """``[queries, keep]`` rows of ``bits`` nearest each packed query code by Hamming
    distance (ties: lower rows), in row order; ``keep`` is capped at the rows."""
    keep = min(keep, len(bits))
    out = np.empty((len(qbits), keep), dtype=np.int64)
    if keep > 0 and len(qbits):
        _hamming(np.ascontiguousarray(qbits, dtype=np.uint8), np.ascontiguousarray(bits, dtype=np.uint8),
                 keep, _POPCOUNT, out)
    return out


@numba.njit(**{**_JIT, "fastmath": True})   # (the dot products vectorize)
def _distances_to(x, norms, c, out):
    # Squared distances of every row to row c as scikit-learn's float32 path
    # computes them: in float64, |x|^2 + |c|^2 - 2 x.c, stored as float32, >= 0.
    for i in range(x.shape[0]):
        dot = 0.0
        for d in range(x.shape[1]):
            dot += np.float64(x[i, d]) * np.float64(x[c, d])
        v = np.float32(-2.0 * dot + norms[c] + norms[i])
        out[i] = v if v > 0 else np.float32(0.0)


def kmeans_plusplus(x: np.ndarray, n_centres: int, seed: int) -> np.ndarray:
    """Indices of ``n_centres`` k-means++ seeds among the rows of ``x`` (one trial each).

    The seeds scikit-learn's ``kmeans_plusplus(x, n_centres, random_state=seed,
    n_local_trials=1)`` picks, at a fraction of its cost: the same draws
    (``RandomState(seed)``: a ``choice`` of the first row, then a ``uniform``
    share of the potential per centre), the same float32 distances and the
    same numpy reductions over them; only the distance products are compiled
    (their float64 sums may differ in the last bits from BLAS's, which could,
    rarely, move a draw to a neighbouring row).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    n_centres = min(n_centres, n)
    out = np.empty(n_centres, dtype=np.int64)
    if not n_centres:
        return out
    rs = np.random.RandomState(seed)
    weight = np.ones(n, dtype=np.float32)
    norms = np.einsum("ij,ij->i", x.astype(np.float64), x.astype(np.float64))
    out[0] = rs.choice(n, p=weight / weight.sum())
    closest = np.empty((1, n), dtype=np.float32)
    _distances_to(x, norms, int(out[0]), closest[0])
    pot = closest @ weight
    column = weight.reshape(-1, 1)
    candidate = np.empty((1, n), dtype=np.float32)
    for j in range(1, n_centres):
        r = rs.uniform(size=1) * pot
        c = min(int(np.searchsorted(np.cumsum(weight * closest[0]), r)[0]), n - 1)
        out[j] = c
        _distances_to(x, norms, c, candidate[0])
        np.minimum(closest, candidate, out=candidate)
        pot = (candidate @ column)[0]
        closest, candidate = candidate, closest
    return out
