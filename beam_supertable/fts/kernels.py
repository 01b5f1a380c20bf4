"""BM25 over a superfile's postings and the best ``k`` rows, in one compiled pass.

A query's postings are merged (each term's are sorted by row), scored, summed
per row and the best rows kept in one numba function (compiled on first use,
cached on disk, releasing the GIL), in place of the twenty-odd numpy calls
whose fixed costs outweighed the arithmetic. Each posting's score is :func:`index.bm25_postings`' expression
in the same order, and a row's score adds its terms' in query-term order from
0, so the scores are bit for bit those of the numpy formulas.

numba caches the compiled code in ``NUMBA_CACHE_DIR`` when set, else beside this
module, or in the user's cache folder when the package folder is read-only.
"""

from __future__ import annotations

from typing import Tuple

import numba
import numpy as np

@numba.njit(nogil=True, cache=True)
def _score_top(rows, tf, starts, ends, idf, needed, norm, k1, k):  # pragma: no cover
    n_terms = len(starts)
    n_needed = 0
    total = 0
    for t in range(n_terms):
        n_needed += needed[t]
        total += ends[t] - starts[t]
    least = max(1, n_needed)
    k1p = k1 + 1
    keep_all = k < 0
    cap = total if keep_all else max(k, 0)
    best_rows = np.empty(cap, np.int64)
    best_scores = np.empty(cap, np.float64)
    n = 0
    # Each term's postings are sorted by row: merged, the rows come ascending and a
    # row's scores are summed in query-term order, without an array over every row.
    at = starts.copy()
    while True:
        r = -1
        for t in range(n_terms):
            if at[t] < ends[t]:
                x = rows[at[t]]
                if r < 0 or x < r:
                    r = x
        if r < 0:
            break
        s = 0.0
        h = 0
        for t in range(n_terms):
            p = at[t]
            if p < ends[t] and rows[p] == r:
                f = np.float64(tf[p])
                s += idf[t] * f * k1p / (f + norm[r])
                if needed[t] == 1 or n_needed == 0:
                    h += 1
                at[t] = p + 1
        if h < least or cap == 0:
            continue
        if keep_all:
            best_rows[n] = r
            best_scores[n] = s
            n += 1
            continue
        # The best k by (score descending, row ascending): rows come ascending, so
        # a later row enters only on a higher score.
        if n == cap:
            if not s > best_scores[cap - 1]:
                continue
            j = cap - 1
        else:
            j = n
            n += 1
        while j > 0 and s > best_scores[j - 1]:
            best_scores[j] = best_scores[j - 1]
            best_rows[j] = best_rows[j - 1]
            j -= 1
        best_scores[j] = s
        best_rows[j] = r
    return best_rows[:n], best_scores[:n]


@numba.njit(nogil=True, cache=True)
def _terms_top(rows, tf, term_start, term_df, ids, idf, needed, norm, k1, k):  # pragma: no cover
    starts = np.empty(len(ids), np.int64)
    ends = np.empty(len(ids), np.int64)
    for t in range(len(ids)):
        starts[t] = term_start[ids[t]]
        ends[t] = starts[t] + term_df[ids[t]]
    return _score_top(rows, tf, starts, ends, idf, needed, norm, k1, k)


def index_top(ix, ids: np.ndarray, idf: np.ndarray, needed: np.ndarray, norm: np.ndarray,
              k: int, k1: float = 1.2) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`score_top` of the terms ``ids`` (int64, their places in a
    :class:`~beam_supertable.fts.index.TextIndex`'s term list), each with its
    ``idf`` (float64), ``needed`` as int8."""
    return _terms_top(ix.rows, ix.tf, ix.start, ix.df, ids, idf, needed, norm, k1, k)


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
    return _score_top(rows, tf, np.ascontiguousarray(starts, dtype=np.int64),
                      np.ascontiguousarray(ends, dtype=np.int64),
                      np.ascontiguousarray(idf, dtype=np.float64),
                      np.ascontiguousarray(needed, dtype=np.int8),
                      np.ascontiguousarray(norm, dtype=np.float64), float(k1), int(k))
