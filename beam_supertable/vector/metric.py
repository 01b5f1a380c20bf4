"""Distances under the three metrics, on float32 matrices.

Internally every metric becomes "smaller is closer": ``l2`` is the squared
Euclidean distance, ``cosine`` is ``1 - cos`` (computed on unit vectors) and
``dot`` is the negated inner product.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

METRICS = ("l2", "cosine", "dot")
PICK_MAX_K = 4     # nearest(): up to this k, a pass per pick beats argpartition,
PICK_SHARE = 16    # and up to one pick per this many points (a vectorized argmax pass
PICK_CAP = 64      # costs ~1/10 of a row-wise argpartition on 1,000+ points), capped
_LOWEST = np.float32(np.finfo(np.float32).min)
CHUNK_SCORES = 1 << 20  # nearest(): a 4 MB block of float32 scores per chunk of queries
CHUNK_MIN_QUERIES = 128
BOUND_SLACK = 1e-4  # bisector_bounds(): relative slack for rows assigned in float32
TINY_NORM = 1e-18   # prepare(): below it a float32 norm loses precision (squares underflow)


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    return metric


def prepare(vectors: np.ndarray, metric: str) -> np.ndarray:
    """What the index stores and compares: float32, unit vectors for cosine.

    A cosine vector is its direction whatever its size: one whose float32 norm
    overflows or underflows (or, given in float64, whose values pass float32's
    range) is scaled in float64 first.
    """
    if metric != "cosine":
        return np.ascontiguousarray(vectors, dtype=np.float32)
    given = np.asarray(vectors)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        x = np.ascontiguousarray(given, dtype=np.float32)
        norms = np.linalg.norm(x, axis=-1, keepdims=True)
        x = x / np.where(norms == 0, 1, norms)
    flat = norms.reshape(-1)
    odd = np.flatnonzero(~np.isfinite(flat) | (flat < TINY_NORM))
    if len(odd):
        wide = given.reshape(len(flat), -1)[odd].astype(np.float64)
        wide /= np.maximum(np.abs(wide).max(axis=1, keepdims=True), np.finfo(np.float64).tiny)
        wide /= np.maximum(np.linalg.norm(wide, axis=1, keepdims=True), 1.0)   # (zero stays zero)
        x.reshape(len(flat), -1)[odd] = wide
    return x


def distances(queries: np.ndarray, points: np.ndarray, metric: str) -> np.ndarray:
    """``[len(queries), len(points)]`` distances, queries and points prepared."""
    dots = queries @ points.T
    if metric == "dot":
        return -dots
    if metric == "cosine":
        return 1.0 - dots
    qn = np.einsum("ij,ij->i", queries, queries)[:, None]
    pn = np.einsum("ij,ij->i", points, points)[None, :]
    return np.maximum(qn + pn - 2 * dots, 0)


def nearest(queries: np.ndarray, points: np.ndarray, metric: str, k: int,
            chunk: Optional[int] = None) -> np.ndarray:
    """Indices of the ``k`` nearest points for each query, nearest first.

    ``chunk`` queries are scored at a time (default: as many as keep the
    score block near ``CHUNK_SCORES`` floats, so the passes over it after the
    product stay in cache; the answers do not depend on it).
    """
    if chunk is None:
        chunk = max(CHUNK_MIN_QUERIES, CHUNK_SCORES // max(1, len(points)))
    k = min(k, len(points))
    out = np.empty((len(queries), k), dtype=np.int64)
    if k < len(points) and k <= max(PICK_MAX_K, min(PICK_CAP, len(points) // PICK_SHARE)) \
            or k == 1:
        # The nearest point maximizes q·p (- |p|²/2 for l2): one product and
        # a subtraction, then a pass per pick; argpartition on full distances
        # cost ~5x, and the distances themselves (norms, clamp) ~3x the
        # product. Equal scores go to the lower index, as with argmin.
        half = 0.5 * np.einsum("ij,ij->i", points, points) if metric == "l2" else None
        for start in range(0, len(queries), chunk):
            score = queries[start:start + chunk] @ points.T
            if half is not None:
                score -= half
            # Picks are masked with -inf: a score overflowed to -inf by huge
            # vectors is raised to the lowest float, so a pick never returns.
            np.maximum(score, _LOWEST, out=score)
            rows = np.arange(len(score))
            for j in range(k):
                best = score.argmax(axis=1)
                out[start:start + chunk, j] = best
                if j + 1 < k:
                    score[rows, best] = -np.inf
        return out
    for start in range(0, len(queries), chunk):
        d = distances(queries[start:start + chunk], points, metric)
        if k < d.shape[1]:
            part = np.argpartition(d, k - 1, axis=1)[:, :k]
        else:
            part = np.tile(np.arange(d.shape[1]), (len(d), 1))
        order = np.take_along_axis(d, part, 1).argsort(axis=1, kind="stable")
        out[start:start + chunk] = np.take_along_axis(part, order, 1)
    return out


def bisector_bounds(queries: np.ndarray, centroids: np.ndarray, cells: np.ndarray,
                    metric: str, chunk_elements: int = 1 << 21) -> np.ndarray:
    """Lower bounds on the distance from each query to any row of each of its cells.

    ``cells[:, 0]`` must be each query's nearest centroid ``c1``, and rows must
    be assigned to their nearest centroid (as the writer does). A row of cell
    ``c`` is then at least as close to ``c`` as to ``c1``: it lies beyond the
    hyperplane bisecting ``c1`` and ``c``, at Euclidean distance at least
    ``h = (|q - c|^2 - |q - c1|^2) / (2 |c - c1|)`` from the query. For
    ``l2`` the bound is ``h^2``; for ``cosine`` (unit rows and centroids)
    ``(h^2 + 1 - |q|^2) / 2``. No such bound holds for ``dot`` (ValueError).
    ``h`` is shrunk by ``BOUND_SLACK`` for rows assigned in float32, and
    ``bounds[:, 0]`` is ``-inf`` (the nearest cell is always probed).

    Args:
        queries: ``[Q, dim]``, prepared for the metric.
        cells: ``[Q, P]`` cell ids, nearest first.
    """
    if metric == "dot":
        raise ValueError("bisector_bounds: no distance bound holds for the dot metric")
    out = np.empty(cells.shape, dtype=np.float32)
    n_q, width = cells.shape
    step = max(1, chunk_elements // max(1, width * queries.shape[1]))
    for start in range(0, n_q, step):
        q = queries[start:start + step].astype(np.float64)
        c = centroids[cells[start:start + step]].astype(np.float64)     # [q, P, dim]
        to_c = np.einsum("qpd,qpd->qp", c - q[:, None, :], c - q[:, None, :])
        gap = c - c[:, :1, :]
        gap = np.sqrt(np.einsum("qpd,qpd->qp", gap, gap))
        with np.errstate(divide="ignore", invalid="ignore"):
            h = np.where(gap > 0, (to_c - to_c[:, :1]) / (2 * gap), 0.0)
        h = np.maximum(h, 0.0) * (1 - BOUND_SLACK)
        if metric == "l2":
            b = h * h
        else:
            b = (h * h + 1 - np.einsum("qd,qd->q", q, q)[:, None]) / 2
        b[:, 0] = -np.inf
        out[start:start + step] = b
    return out


def vectors_of(table, column: str, dim: int) -> np.ndarray:
    """A ``fixed_size_list<float>`` column of an Arrow table as ``[rows, dim]`` float32."""
    col = table.column(column).combine_chunks()
    flat = col.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(len(col), dim)
