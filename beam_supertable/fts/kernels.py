"""BM25 over a superfile's postings and the best ``k`` rows, in one compiled pass.

A query's postings are scored, summed per row and the best rows kept in one
numba function (compiled on first use, cached on disk, releasing the GIL), in
place of the twenty-odd numpy calls whose fixed costs outweighed the
arithmetic. Each posting's score is :func:`index.bm25_postings`' expression
in the same order, and a row's score adds its terms' in query-term order from
0, so the scores are bit for bit those of the numpy formulas.

numba caches the compiled code beside this module, or in the user's cache
folder (``NUMBA_CACHE_DIR`` if set) when the package folder is read-only.
"""

from __future__ import annotations

from typing import Tuple

import numba
import numpy as np

DENSE_SHARE = 8   # postings above 1/8 of a superfile's rows: sums in an array over every row


@numba.njit(nogil=True, cache=True)
def _score_top(rows, tf, starts, ends, idf, needed, norm, k1, k, dense):  # pragma: no cover
    n_terms = len(starts)
    n_needed = 0
    for t in range(n_terms):
        n_needed += needed[t]
    least = max(1, n_needed)
    total = 0
    for t in range(n_terms):
        total += ends[t] - starts[t]
    k1p = k1 + 1
    if dense:
        n_rows = len(norm)
        acc = np.zeros(n_rows, np.float64)
        hits = np.zeros(n_rows, np.int32)
        for t in range(n_terms):
            w = idf[t]
            count = needed[t] == 1 or n_needed == 0
            for p in range(starts[t], ends[t]):
                r = rows[p]
                f = np.float64(tf[p])
                acc[r] += w * f * k1p / (f + norm[r])
                if count:
                    hits[r] += 1
        cand_rows = np.empty(total, np.int64)
        cand_scores = np.empty(total, np.float64)
        m = 0
        for t in range(n_terms):
            for p in range(starts[t], ends[t]):
                r = rows[p]
                if hits[r] >= least:
                    hits[r] = -1   # (taken once)
                    cand_rows[m] = r
                    cand_scores[m] = acc[r]
                    m += 1
        order = np.argsort(cand_rows[:m])
        cand_rows = cand_rows[:m][order]
        cand_scores = cand_scores[:m][order]
    else:
        flat_rows = np.empty(total, np.int64)
        each = np.empty(total, np.float64)
        mark = np.empty(total, np.int32)
        q = 0
        for t in range(n_terms):
            w = idf[t]
            for p in range(starts[t], ends[t]):
                r = rows[p]
                f = np.float64(tf[p])
                flat_rows[q] = r
                each[q] = w * f * k1p / (f + norm[r])
                mark[q] = 1 if (needed[t] == 1 or n_needed == 0) else 0
                q += 1
        # Stable: a row's postings stay in query-term order, and are summed so.
        order = np.argsort(flat_rows, kind="mergesort")
        cand_rows = np.empty(total, np.int64)
        cand_scores = np.empty(total, np.float64)
        m = 0
        i = 0
        while i < total:
            r = flat_rows[order[i]]
            s = 0.0
            h = 0
            while i < total and flat_rows[order[i]] == r:
                s += each[order[i]]
                h += mark[order[i]]
                i += 1
            if h >= least:
                cand_rows[m] = r
                cand_scores[m] = s
                m += 1
        cand_rows = cand_rows[:m]
        cand_scores = cand_scores[:m]
    if k < 0 or m <= k:
        if k < 0:
            return cand_rows, cand_scores
        kk = m
    else:
        kk = k
    # The best kk by (score descending, row ascending): rows come ascending, so
    # a later row enters only on a higher score.
    best_rows = np.empty(kk, np.int64)
    best_scores = np.empty(kk, np.float64)
    n = 0
    for i in range(m):
        s = cand_scores[i]
        if n == kk:
            if not s > best_scores[kk - 1]:
                continue
            j = kk - 1
        else:
            j = n
            n += 1
        while j > 0 and s > best_scores[j - 1]:
            best_scores[j] = best_scores[j - 1]
            best_rows[j] = best_rows[j - 1]
            j -= 1
        best_scores[j] = s
        best_rows[j] = cand_rows[i]
    return best_rows, best_scores


def score_top(rows: np.ndarray, tf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
              idf: np.ndarray, needed: np.ndarray, norm: np.ndarray, k: int,
              k1: float = 1.2) -> Tuple[np.ndarray, np.ndarray]:
    """BM25 of the query terms whose postings are ``rows[starts[i]:ends[i]]`` (their
    ``tf`` alike), each with its ``idf``; ``norm`` is every row's length term
    (:meth:`TextIndex.length_norm`). A row counts when it holds a term and every
    term ``needed`` marks (1), or any term when none is marked.

    Returns the best ``k`` (rows, scores), best first, ties by row; with ``k < 0``,
    every counted row, ascending, and its score.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    total = int((ends - starts).sum()) if len(starts) else 0
    dense = total * DENSE_SHARE > len(norm)
    return _score_top(rows, tf, starts, ends, np.ascontiguousarray(idf, dtype=np.float64),
                      np.ascontiguousarray(needed, dtype=np.int8),
                      np.ascontiguousarray(norm, dtype=np.float64), float(k1), int(k), dense)
