"""Batched IVF search over superfiles: probe cells, score codes, rerank exactly.

Queries are processed together: for each superfile, every probed cell (or
fine run) is decoded once and scored against all the queries that probe it
with one matrix product; each query keeps its best SQ8 candidates, which are
then reranked exactly with the fp32 vectors read from the Parquet data.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from threadpoolctl import threadpool_limits

from beam_supertable.reader import SuperfileReader
from beam_supertable.vector import codes
from beam_supertable.vector.metric import distances, nearest

NPROBE_PER_SQRT_CELL = 0.45      # nprobe = ceil(0.45 * sqrt(n_cells)): recall@10 >= 0.95 on the benchmarks
RERANK_PER_K = 3                 # SQ8 candidates reranked exactly, per requested k
RUN_KEEP_PER_K = 3               # SQ8 candidates a run may contribute, per requested k
SHORTLIST_MIN_ENTRIES = 16_384   # runs larger than this are shortlisted by 1-bit codes
SHORTLIST_SHARE = 0.25
FINE_PROBE_SHARE = 0.5


def default_nprobe(n_cells: int) -> int:
    """Cells probed by default: grows like sqrt(n_cells), as the cells do."""
    return max(1, min(n_cells, math.ceil(NPROBE_PER_SQRT_CELL * math.sqrt(n_cells))))


class VectorIndex:
    """One superfile's vector index sections, loaded on demand and cached."""

    def __init__(self, reader: SuperfileReader) -> None:
        self.reader = reader
        vec = reader.header["vector"]
        self.dim = vec["dim"]
        self.column = vec["column"]
        self.rows = reader.header["rows"]
        self.nbytes = (self.dim + 7) // 8
        # cell -> [(start, stop, fine index)], the fine runs of the cell
        self.runs: Dict[int, List[Tuple[int, int, int]]] = {}
        for (cell, start, count, fine_start, n_fine), counts in zip(vec["cells"], vec["fine_counts"]):
            offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            self.runs[cell] = [(start + offs[j], start + offs[j + 1], fine_start + j)
                               for j in range(n_fine)]
        for cell, start, count, fine, _ in vec["replicas"]:
            self.runs.setdefault(cell, []).append((self.rows + start, self.rows + start + count, fine))
        self._params = None
        self._fine = None
        self._replica_rows = None

    def params(self) -> np.ndarray:
        if self._params is None:
            self._params = np.frombuffer(self.reader.section("vector.sq8_params"),
                                         dtype="<f4").reshape(2, self.dim)
        return self._params

    def fine_centroids(self) -> np.ndarray:
        if self._fine is None:
            self._fine = np.frombuffer(self.reader.section("vector.fine_centroids"),
                                       dtype="<f4").reshape(-1, self.dim)
        return self._fine

    def decoded(self, start: int, stop: int) -> np.ndarray:
        """The SQ8 codes of entries ``[start, stop)`` decoded to fp32 (kept in the cache)."""
        def load():
            data = self.reader.section_range("vector.sq8", start * self.dim, stop * self.dim)
            dec = codes.sq8_decode(np.frombuffer(data, dtype=np.uint8).reshape(-1, self.dim),
                                   self.params())
            return dec, dec.nbytes

        return self.reader.cache.get_or_load(self.reader.cache_key("sq8", start, stop), load)

    def bits(self, start: int, stop: int) -> np.ndarray:
        data = self.reader.section_range("vector.bits", start * self.nbytes, stop * self.nbytes)
        return np.frombuffer(data, dtype=np.uint8).reshape(-1, self.nbytes)

    def to_rows(self, entries: np.ndarray) -> np.ndarray:
        if len(entries) == 0 or entries.max() < self.rows:
            return entries
        if self._replica_rows is None:
            self._replica_rows = np.frombuffer(
                self.reader.section("vector.replica_rows"), dtype="<i4").astype(np.int64)
        out = entries.copy()
        rep = entries >= self.rows
        out[rep] = self._replica_rows[entries[rep] - self.rows]
        return out


def _probe_runs(index: VectorIndex, queries: np.ndarray, probes: np.ndarray, metric: str
                ) -> Dict[Tuple[int, int, int], List[int]]:
    """Which queries score which runs of this superfile."""
    by_cell: Dict[int, List[int]] = {}
    for qi, cells in enumerate(probes):
        for c in cells:
            if c in index.runs:
                by_cell.setdefault(int(c), []).append(qi)
    out: Dict[Tuple[int, int, int], List[int]] = {}
    for cell, qs in by_cell.items():
        runs = index.runs[cell]
        main = [r for r in runs if r[0] < index.rows]
        rest = [r for r in runs if r[0] >= index.rows]
        if len(main) > 1:
            cents = index.fine_centroids()[[r[2] for r in main]]
            probe = max(1, math.ceil(len(main) * FINE_PROBE_SHARE))
            picks = nearest(queries[qs], cents, metric, probe)
            for qi, pick in zip(qs, picks):
                for j in pick:
                    out.setdefault(main[j], []).append(qi)
        else:
            for r in main:
                out.setdefault(r, []).extend(qs)
        for r in rest:
            out.setdefault(r, []).extend(qs)
    return out


def _shortlist(index: VectorIndex, run, queries: np.ndarray, qs: np.ndarray, keep: int):
    """1-bit shortlist of a large run for each query: the ``keep`` best by Hamming."""
    start, stop, fine = run
    center = index.fine_centroids()[fine]
    bits = index.bits(start, stop)
    qbits = codes.bits_encode(queries[qs] - center)
    keep = min(keep, stop - start)
    out = np.empty((len(qs), keep), dtype=np.int64)
    for j in range(len(qs)):
        ham = codes.hamming(qbits[j], bits)
        out[j] = np.argpartition(ham, keep - 1)[:keep]
    return out


def search_superfile(index: VectorIndex, queries: np.ndarray, probes: np.ndarray,
                     metric: str, k: int,
                     allowed: Optional[Callable[[np.ndarray], np.ndarray]]
                     ) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Per query, (rows, exact distances) of its best ``k`` rows in this superfile.

    Candidates live in one padded ``[queries, slots]`` matrix filled run by run,
    so selection and rerank are array operations, not per-query loops.
    """
    n_q = len(queries)
    depth = k * RERANK_PER_K
    # A query's top k holds at most k rows of any run; a few more absorb the
    # SQ8 error, so each run hands on only its best RUN_KEEP_PER_K * k.
    keep_run = k * RUN_KEEP_PER_K
    runs = _probe_runs(index, queries, probes, metric)
    slots = np.zeros(n_q, dtype=np.int64)
    for (start, stop, _), qs in runs.items():
        n = stop - start
        c = min(n, keep_run) if n <= SHORTLIST_MIN_ENTRIES else keep_run
        np.add.at(slots, qs, c)
    width = int(slots.max()) if n_q else 0
    empty = [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * n_q
    if width == 0:
        return empty
    cand = np.full((n_q, width), -1, dtype=np.int64)
    cand_d = np.full((n_q, width), np.inf, dtype=np.float32)
    fill = np.zeros(n_q, dtype=np.int64)
    for run, qs in runs.items():
        start, stop, _ = run
        if stop <= start:
            continue
        qs = np.asarray(qs)
        dec = index.decoded(start, stop)
        if stop - start > SHORTLIST_MIN_ENTRIES:
            keep = max(depth, int((stop - start) * SHORTLIST_SHARE))
            picks = _shortlist(index, run, queries, qs, keep)
            d = np.stack([distances(queries[qi][None, :], dec[picks[j]], metric)[0]
                          for j, qi in enumerate(qs)])
            part = np.argpartition(d, keep_run - 1, axis=1)[:, :keep_run]
            d = np.take_along_axis(d, part, 1)
            ids = start + np.take_along_axis(picks, part, 1)
        else:
            d = distances(queries[qs], dec, metric)
            if d.shape[1] > keep_run:
                part = np.argpartition(d, keep_run - 1, axis=1)[:, :keep_run]
                d = np.take_along_axis(d, part, 1)
                ids = start + part
            else:
                ids = np.broadcast_to(np.arange(start, stop), d.shape)
        cols = fill[qs][:, None] + np.arange(d.shape[1])[None, :]
        cand[qs[:, None], cols] = ids
        cand_d[qs[:, None], cols] = d
        fill[qs] += d.shape[1]
    if index.reader.header["vector"]["replicas"]:
        valid = cand >= 0
        cand[valid] = index.to_rows(cand[valid])
        order = np.argsort(cand_d, axis=1, kind="stable")
        cand = np.take_along_axis(cand, order, 1)
        cand_d = np.take_along_axis(cand_d, order, 1)
        for qi in range(n_q):  # a row posted twice keeps its best copy
            row = cand[qi]
            _, first = np.unique(row, return_index=True)
            dup = np.ones(width, dtype=bool)
            dup[first] = False
            cand_d[qi, dup] = np.inf
    if allowed is not None:
        live = cand[np.isfinite(cand_d)]
        union = np.unique(live)
        ok = union[allowed(union)] if len(union) else union
        cand_d[~np.isin(cand, ok)] = np.inf
    if width > depth:
        part = np.argpartition(cand_d, depth - 1, axis=1)[:, :depth]
        cand = np.take_along_axis(cand, part, 1)
        cand_d = np.take_along_axis(cand_d, part, 1)
    valid = np.isfinite(cand_d)
    if not valid.any():
        return empty
    need = np.unique(cand[valid])
    lookup = index.reader.vectors(need, index.column, metric)
    exact = np.full(cand.shape, np.inf, dtype=np.float32)
    vecs = lookup(cand[valid])
    owners = np.nonzero(valid)[0]
    if metric == "l2":
        diff = vecs - queries[owners]
        exact[valid] = np.einsum("ij,ij->i", diff, diff)
    else:
        dots = np.einsum("ij,ij->i", vecs, queries[owners])
        exact[valid] = 1.0 - dots if metric == "cosine" else -dots
    best = np.argsort(exact, axis=1, kind="stable")[:, :k]
    rows = np.take_along_axis(cand, best, 1)
    dist = np.take_along_axis(exact, best, 1)
    out = []
    for qi in range(n_q):
        keep = np.isfinite(dist[qi])
        out.append((rows[qi][keep], dist[qi][keep]))
    return out


def vector_search(indexes: Sequence[VectorIndex], queries: np.ndarray, probes: np.ndarray,
                  metric: str, k: int,
                  allowed: Optional[Callable[[int, np.ndarray], np.ndarray]] = None
                  ) -> List[List[Tuple[float, int, int]]]:
    """Per query, its best ``k`` (distance, superfile, row) over all superfiles."""
    def one(si):
        return search_superfile(indexes[si], queries, probes, metric, k,
                                None if allowed is None else (lambda rows: allowed(si, rows)))

    if len(indexes) > 1:
        # One thread per superfile; BLAS kept to one thread each so the
        # threads do not oversubscribe the cores.
        with threadpool_limits(1, "blas"), \
                ThreadPoolExecutor(max_workers=min(len(indexes), os.cpu_count() or 2)) as pool:
            per_sf = list(pool.map(one, range(len(indexes))))
    else:
        per_sf = [one(0)] if indexes else []
    out = []
    for qi in range(len(queries)):
        merged = []
        for si, res in enumerate(per_sf):
            rows, d = res[qi]
            merged.extend(zip(d.tolist(), [si] * len(rows), rows.tolist()))
        merged.sort()
        out.append(merged[:k])
    return out
