"""Batched IVF search over superfiles: probe cells, score codes, rerank exactly.

Queries are processed together: for each superfile, every probed cell (or
fine run) is decoded once and scored against all the queries that probe it
with one matrix product; each query keeps its best SQ8 candidates, which are
then reranked exactly with the fp32 vectors read from the Parquet data.

Probing is adaptive per query (:func:`vector_search` with ``bounds``): a
query first scores its nearest cell, which gives it an exact k-th distance;
each further cell of its probe list is scored only if a lower bound on the
distance of any row in that cell (:func:`cell_bounds`) is below it. Rows are
assigned to their nearest centroid, so a row of cell ``c`` lies on ``c``'s
side of the bisecting hyperplane between ``c`` and the query's nearest centre
``c1``; the query's distance to that hyperplane bounds its distance to every
row of ``c``. Skipping such a cell cannot drop a row of the true top k, so it
never lowers recall; it pays off where cells are well separated.

A batch spreads its superfiles over one module-level thread pool; a single
query (or a one-superfile table) runs inline, with no per-call set-up.
Small tables (``dense.DENSE_MAX_BYTES`` of vectors) answer unfiltered
batches from their live vectors held whole instead (:mod:`dense`): there
the fixed costs per superfile and run, not the arithmetic, were the time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from beam_supertable.reader import SuperfileReader
from beam_supertable.vector import codes
from beam_supertable.vector.calibrate import check_target, fallback_nprobe
from beam_supertable.superfile import vectors_of
from beam_supertable.vector.metric import bisector_bounds, nearest, prepare

RERANK_PER_K = 3                 # SQ8 candidates reranked exactly, per requested k
SHORTLIST_MIN_ENTRIES = 16_384   # runs larger than this are shortlisted by 1-bit codes
SHORTLIST_SHARE = 0.25
FINE_PROBE_SHARE = 0.5
SQ8_ONCE, EXACT, SQ8_AGAIN = 1, 2, 3   # a run's state in a handle's cache (0: not loaded)
EXACT_FIRST_RUNS = 4             # a search loading at most this many runs reads their fp32 rows
PARALLEL_MIN_QUERIES = 16        # smaller batches run inline: threads cost more than they save
SEARCH_THREADS = os.cpu_count() or 2
FIRST_PROBES = 1                 # cells every query scores before bounds may skip the rest

_POOL: Optional[ThreadPoolExecutor] = None
_BLAS = None
_BLAS_LIBS = None   # the BLAS libraries' controllers (one_blas_thread)
_POOL_LOCK = threading.Lock()


def default_nprobe(n_cells: int) -> int:
    """Cells probed on a table without a probe law (see ``calibrate.fallback_nprobe``)."""
    return fallback_nprobe(n_cells)


def check_probe_args(where: str, nprobe, recall_target) -> None:
    """Validates ``search``'s ``nprobe`` and ``recall_target`` (at most one of them)."""
    if nprobe is not None and recall_target is not None:
        raise ValueError(f"{where}: give nprobe or recall_target, not both (got nprobe={nprobe!r}, "
                         f"recall_target={recall_target!r})")
    if nprobe is not None and (isinstance(nprobe, bool) or not isinstance(nprobe, (int, np.integer))
                               or nprobe <= 0):
        raise ValueError(f"{where}: nprobe must be a positive int, got {nprobe!r}")
    if recall_target is not None:
        try:
            check_target(recall_target)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


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


@dataclasses.dataclass(frozen=True)
class Probes:
    """Each query's cells to probe, nearest first, and optional lower bounds.

    Args:
        cells: ``[queries, nprobe]`` cell ids (-1: skip).
        bounds: ``[queries, nprobe]`` lower bounds on the distance (in the
            metric's "smaller is closer" form) of any row of each cell, or
            None where no bound holds (``dot``).
    """

    cells: np.ndarray
    bounds: Optional[np.ndarray] = None


def rank_cells(queries: np.ndarray, centroids: np.ndarray, metric: str, nprobe: int,
               with_bounds: bool = False) -> Probes:
    """The ``nprobe`` nearest cells of each (prepared) query, nearest first.

    Args:
        with_bounds: also compute ``metric.bisector_bounds`` so the search
            can skip cells (needs rows assigned to their nearest centroid,
            which the writer does; never for ``dot``).
    """
    cells = nearest(queries, centroids, metric, nprobe)
    bounds = bisector_bounds(queries, centroids, cells, metric) \
        if with_bounds and metric != "dot" and cells.shape[1] > FIRST_PROBES else None
    return Probes(cells, bounds)


class _Stores:
    """One superfile's loaded runs (see :class:`VectorIndex`) and the bytes charged for them."""

    __slots__ = ("score", "exact", "state", "nbytes")

    def __init__(self, score: np.ndarray, exact: np.ndarray, state: np.ndarray) -> None:
        self.score, self.exact, self.state = score, exact, state
        self.nbytes = 0

    def arrays(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.score, self.exact, self.state


class VectorIndex:
    """One superfile's vector index sections, loaded on demand and cached.

    Two stores, filled a run at a time: the scoring store, ``[dim, entries]``
    (transposed, so a run's rows are a matrix the product with a few queries
    is fast on), holding decoded SQ8 codes, or the exact fp32 rows once the
    run has been reranked; and the exact store, ``[rows, dim]`` fp32 rows for
    reranks. A warm handle therefore scores exactly and reads nothing.

    The stores live in the handle's ``ByteCache`` (charged by the bytes
    loaded into them, evicted with everything else the handle keeps); a
    search pins them (:meth:`pinned`), so an eviction during a search frees
    them when it ends, and the next search starts from empty stores.
    """

    def __init__(self, reader: SuperfileReader) -> None:
        self.reader = reader
        vec = reader.header["vector"]
        self.dim = vec["dim"]
        self.column = vec["column"]
        self.metric = vec["metric"]
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
        self.cell_ids = np.array(sorted(self.runs), dtype=np.int64)
        self.has_replicas = bool(vec["replicas"])
        self.entries = self.rows + sum(r[2] for r in vec["replicas"])
        # Every run, main and replica, tiles [0, entries): where each starts and stops.
        spans = sorted(r[:2] for runs in self.runs.values() for r in runs)
        self._starts = np.array([r[0] for r in spans], dtype=np.int64)
        self._stops = np.array([r[1] for r in spans], dtype=np.int64)
        self._run_at = {start: i for i, (start, _) in enumerate(spans)}
        # Row groups are cut at cell boundaries: a run never straddles two.
        meta = reader.metadata
        self._rg_starts = np.cumsum([0] + [meta.row_group(i).num_rows
                                           for i in range(meta.num_row_groups)])
        self._lock = threading.Lock()
        self._pin = threading.local()
        self._key = reader.cache_key("vector.stores")
        self._params = None
        self._fine = None
        self._replica_rows = None

    def _fresh(self) -> _Stores:
        # np.empty: only the pages of the runs loaded are ever touched.
        return _Stores(np.empty((self.dim + 1, self.entries), dtype=np.float32),  # scoring
                       np.empty((self.rows, self.dim), dtype=np.float32),         # exact rows
                       np.zeros(len(self._starts), dtype=np.int8))   # run states, below

    def _cached(self) -> _Stores:
        """The stores in the handle's cache, or fresh ones put there."""
        cache = self.reader.cache
        stores = cache.get(self._key)
        if stores is None:
            with self._lock:
                stores = cache.get(self._key)
                if stores is None:
                    stores = cache.put(self._key, self._fresh(), 0)
        return stores

    @contextlib.contextmanager
    def pinned(self):
        """Holds this thread's stores for one search: the same ones from start to end."""
        if getattr(self._pin, "stores", None) is not None:   # (nested)
            yield
            return
        self._pin.stores = self._cached()
        try:
            yield
        finally:
            self._pin.stores = None

    def _stores(self) -> _Stores:
        stores = getattr(self._pin, "stores", None)
        return stores if stores is not None else self._cached()

    def _room(self, nbytes: int) -> _Stores:
        """The stores to fill with ``nbytes`` more, charged to the cache; hold the lock.

        Fresh stores when the handle's whole budget would not hold these
        (the old ones then go when no search pins them any more).
        """
        stores = self._stores()
        cache = self.reader.cache
        if stores.nbytes and stores.nbytes + nbytes > cache.capacity_bytes:
            stores = self._fresh()
            if getattr(self._pin, "stores", None) is not None:
                self._pin.stores = stores
        stores.nbytes += nbytes
        cache.put(self._key, stores, stores.nbytes)
        return stores

    def _put_scoring(self, score: np.ndarray, a: int, b: int, x: np.ndarray) -> None:
        # Column j of the scoring store is (-2 x_j, |x_j|^2) for l2 and (-x_j, 0)
        # otherwise, so [q, 1] times it is the score of query q: one product.
        if self.metric == "l2":
            score[:-1, a:b] = -2 * x.T
            score[-1, a:b] = np.einsum("ij,ij->i", x, x)
        else:
            score[:-1, a:b] = -x.T
            score[-1, a:b] = 0

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

    def scoring_rows(self, start: int, stop: int) -> Tuple[np.ndarray, bool]:
        """A run's scoring columns (``[dim + 1, n]``: see :func:`scores`), and exact?

        The exact rows when the run has been reranked before, else its
        decoded SQ8 codes (one ranged read, the first time).
        """
        run = self._run_at[start]
        score, _, state = self._stores().arrays()
        if state[run] == SQ8_ONCE:
            state[run] = SQ8_AGAIN    # scored from codes twice: promote() loads its rows
        elif not state[run]:
            data = self.reader.section_range("vector.sq8", start * self.dim, stop * self.dim)
            dec = codes.sq8_decode(np.frombuffer(data, dtype=np.uint8).reshape(-1, self.dim),
                                   self.params())
            with self._lock:
                score, _, state = self._stores().arrays()
                if not state[run]:
                    score, _, state = self._room(dec.nbytes).arrays()
                    self._put_scoring(score, start, stop, dec)
                    state[run] = SQ8_ONCE
        return score[:, start:stop], bool(state[run] == EXACT)

    def promote(self) -> None:
        """Loads the exact rows of the runs scored from codes more than once.

        A run a handle keeps probing is then scored exactly, with no rerank;
        a single cold query reads no more than it needs.
        """
        state = self._stores().state
        again = np.flatnonzero(state == SQ8_AGAIN)
        if len(again):
            self.exact_rows(self._starts[again], self.metric)

    def load_small(self, starts) -> None:
        """Loads the exact rows of a few runs not yet loaded, instead of their codes.

        A query that probes few cold runs reads their fp32 rows straight
        away: its candidates come from those runs, so codes first would mean
        a read for the codes and another for the rows of the same runs.
        """
        state = self._stores().state
        cold = [a for a in starts if a < self.rows and not state[self._run_at[a]]]
        if 0 < len(cold) <= EXACT_FIRST_RUNS:
            self.exact_rows(np.asarray(cold, dtype=np.int64), self.metric)

    def scoring_store(self) -> np.ndarray:
        """The scoring columns of every run (valid for the runs loaded)."""
        return self._stores().score

    def all_exact(self, starts: Sequence[int]) -> bool:
        """Whether every run starting at ``starts`` scores with exact rows."""
        state = self._stores().state
        return all(state[self._run_at[a]] == EXACT for a in starts)

    def decoded(self, start: int, stop: int) -> np.ndarray:
        """A run's scoring columns as rows, ``[n, dim + 1]`` (the 1-bit shortlist path)."""
        return self.scoring_rows(start, stop)[0].T

    def vectors(self, start: int, stop: int) -> np.ndarray:
        """Entries ``[start, stop)`` as (prepared) vectors, ``[n, dim]``: the
        exact rows when the run is loaded, else its decoded SQ8 codes."""
        cols = self.scoring_rows(start, stop)[0][:-1].T
        return cols * np.float32(-0.5 if self.metric == "l2" else -1.0)

    def exact_rows(self, rows: np.ndarray, metric: str) -> np.ndarray:
        """The fp32 vectors of ``rows`` (prepared for the metric), loading their runs.

        A run is read once, with the Parquet row groups that hold it; from
        then on it is also what the run is scored with.
        """
        runs = np.searchsorted(self._starts, rows, side="right") - 1
        _, exact, state = self._stores().arrays()
        if (state[runs] == EXACT).all():
            return exact[rows]
        with self._lock:
            need = np.unique(runs[self._stores().state[runs] != EXACT])
            # Whole row groups load (a read is a row group's column chunk), and
            # adjacent ones together; every run inside them becomes exact.
            groups = np.unique(np.searchsorted(self._rg_starts, self._starts[need], side="right") - 1)
            size = int((self._rg_starts[groups + 1] - self._rg_starts[groups]).sum()) \
                * self.dim * 8    # (exact rows and scoring columns)
            score, exact, state = self._room(size).arrays()
            need = np.unique(runs[state[runs] != EXACT])   # (another thread may have loaded some)
            if not len(need):
                return exact[rows]
            groups = np.unique(np.searchsorted(self._rg_starts, self._starts[need], side="right") - 1)
            for span in np.split(groups, np.flatnonzero(np.diff(groups) != 1) + 1):
                a, b = int(self._rg_starts[span[0]]), int(self._rg_starts[span[-1] + 1])
                table = self.reader.take(np.arange(a, b), columns=[self.column])
                x = prepare(vectors_of(table, self.column, self.dim), metric)
                exact[a:b] = x
                self._put_scoring(score, a, b, x)
                inside = np.arange(np.searchsorted(self._starts, a),
                                   np.searchsorted(self._starts, b))
                state[inside[self._starts[inside] < self.rows]] = EXACT
            return exact[rows]

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
                ) -> List[Tuple[Tuple[int, int, int], np.ndarray, np.ndarray, int]]:
    """Which queries score which runs of this superfile (cells < 0 are skipped).

    Returns:
        ``[(run, queries, leads, n_leads)]``: ``leads`` marks, per query,
        whether the run belongs to the query's nearest probed cell here.
    """
    n_q, width = probes.shape
    flat = probes.ravel()
    if not len(index.cell_ids) or not len(flat):
        return []
    pos = np.minimum(np.searchsorted(index.cell_ids, flat), len(index.cell_ids) - 1)
    owners = np.nonzero((flat >= 0) & (index.cell_ids[pos] == flat))[0]
    if not len(owners):
        return []
    qids = owners // width
    # owners ascend, so each query's first owner is its nearest probed cell here.
    lead = np.ones(len(owners), dtype=bool)
    lead[1:] = qids[1:] != qids[:-1]
    cells = flat[owners]
    order = np.argsort(cells, kind="stable")
    cells, qids, lead = cells[order], qids[order], lead[order]
    at = np.flatnonzero(np.concatenate([[True], cells[1:] != cells[:-1]]))
    n_leads = np.add.reduceat(lead, at).tolist()
    bounds = at.tolist() + [len(cells)]
    out = []
    for i, cell in enumerate(cells[at].tolist()):
        lo, hi = bounds[i], bounds[i + 1]
        qs, ld = qids[lo:hi], lead[lo:hi]
        runs = index.runs[cell]
        if len(runs) == 1:
            out.append((runs[0], qs, ld, n_leads[i]))
            continue
        main = [r for r in runs if r[0] < index.rows]
        rest = [r for r in runs if r[0] >= index.rows]
        if len(main) > 1:
            cents = index.fine_centroids()[[r[2] for r in main]]
            probe = max(1, math.ceil(len(main) * FINE_PROBE_SHARE))
            picks = nearest(queries[qs], cents, metric, probe)
            for j, run in enumerate(main):
                hit = (picks == j).any(axis=1)
                if hit.any():
                    mine = ld[hit] & (picks[hit, 0] == j)
                    out.append((run, qs[hit], mine, int(mine.sum())))
        else:
            out.extend((r, qs, ld, n_leads[i]) for r in main)
        out.extend((r, qs, np.zeros(len(qs), dtype=bool), 0) for r in rest)
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


def scores(queries: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Scores of augmented queries (``[q, 1]``) against scoring columns.

    Distances up to a per-query constant, which is all a per-query ranking
    needs: ``|x|^2 - 2 q.x`` for l2 (the squared distance less ``|q|^2``),
    ``-q.x`` for cosine and dot.
    """
    return queries @ columns


def _top_per_query(cq: np.ndarray, cd: np.ndarray, cr: np.ndarray, limit: int):
    """The ``limit`` lowest-score (query, score, row) triples of each query, by query then score."""
    order = np.argsort(cd, kind="stable")
    order = order[np.argsort(cq[order], kind="stable")]
    cq, cd, cr = cq[order], cd[order], cr[order]
    starts = np.flatnonzero(np.concatenate([[True], cq[1:] != cq[:-1]]))
    rank = np.arange(len(cq)) - np.repeat(starts, np.diff(np.concatenate([starts, [len(cq)]])))
    keep = rank < limit
    return cq[keep], cd[keep], cr[keep], rank[keep]


def search_superfile(index: VectorIndex, queries: np.ndarray, probes: np.ndarray,
                     metric: str, k: int,
                     allowed: Optional[Callable[[np.ndarray], np.ndarray]]
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """``[queries, k]`` rows (-1 pads) and exact distances of each query's best rows here.

    Each query keeps its ``depth`` best rows by score over all its runs:
    ``RERANK_PER_K * k`` when some were scored from SQ8 codes (they are then
    rescored exactly), ``k`` when every run was scored exactly. The selection
    is threshold based: a query's cut-off is the ``depth``-th best score in
    the run of its nearest cell (an upper bound on its ``depth``-th best
    overall), so only the rows under it, usually a few more than ``depth``,
    are sorted. The loop over runs does the products; everything after it
    works on all the runs' scores at once.
    """
    with index.pinned():
        return _search_superfile(index, queries, probes, metric, k, allowed)


def _search_superfile(index: VectorIndex, queries: np.ndarray, probes: np.ndarray,
                      metric: str, k: int,
                      allowed: Optional[Callable[[np.ndarray], np.ndarray]]
                      ) -> Tuple[np.ndarray, np.ndarray]:
    n_q = len(queries)
    runs = _probe_runs(index, queries, probes, metric)
    if not runs:
        return _empty(n_q, k)
    augmented = np.concatenate([queries, np.ones((n_q, 1), np.float32)], axis=1)
    index.load_small(run[0] for run, _, _, _ in runs)
    exact = index.all_exact([run[0] for run, _, _, _ in runs])
    depth = k if exact else k * RERANK_PER_K
    warm = index.scoring_store() if exact else None   # every run loaded: no per-run checks
    cut = np.full(n_q, np.inf, dtype=np.float32)
    blocks, owners, firsts, widths = [], [], [], []
    for run, qs, lead, n_lead in runs:
        start, stop, _ = run
        if stop <= start:
            continue
        if stop - start > SHORTLIST_MIN_ENTRIES:
            cols = index.decoded(start, stop)
            keep = max(k * RERANK_PER_K, int((stop - start) * SHORTLIST_SHARE))
            picks = _shortlist(index, run, queries, qs, keep)
            for qi, pick, is_lead in zip(qs.tolist(), picks, lead.tolist()):
                # One query at a time: each scores its own shortlist.
                d = scores(augmented[qi][None, :], cols[pick].T)
                if is_lead and d.shape[1] >= depth:
                    cut[qi] = np.partition(d[0], depth - 1)[depth - 1]
                blocks.append(d)
                owners.append(np.array([qi]))
                firsts.append(start + pick)
                widths.append(len(pick))
            continue
        cols = warm[:, start:stop] if warm is not None else index.scoring_rows(start, stop)[0]
        d = scores(augmented[qs], cols)
        if n_lead and stop - start >= depth:
            if n_lead == len(qs):
                cut[qs] = np.partition(d, depth - 1, axis=1)[:, depth - 1]
            else:
                cut[qs[lead]] = np.partition(d[lead], depth - 1, axis=1)[:, depth - 1]
        blocks.append(d)
        owners.append(qs)
        firsts.append(start)
        widths.append(stop - start)
    if not blocks:
        return _empty(n_q, k)
    if np.isinf(cut).any():
        for qs, d in zip(owners, blocks):
            # A nearest run too small to give a cut-off: any run big enough gives one.
            open_ = np.isinf(cut[qs])
            if d.shape[1] >= depth and open_.any():
                cut[qs[open_]] = np.partition(d[open_], depth - 1, axis=1)[:, depth - 1]
    flat = _Flat(owners, blocks, firsts, widths)
    cq, cd, cr = flat.under(cut)
    if allowed is not None and len(cr):
        keep = _allowed_mask(index, cr, allowed)
        cq, cd, cr = cq[keep], cd[keep], cr[keep]
        # Rows the filter dropped must not cost a query its places: a query
        # left with fewer than ``depth`` takes every probed row instead.
        short = (np.bincount(cq, minlength=n_q) < depth) & np.isfinite(cut)
        if short.any():
            wq, wd, wr = flat.under(np.where(short, np.inf, -np.inf).astype(np.float32))
            keep = _allowed_mask(index, wr, allowed)
            drop = short[cq]
            cq = np.concatenate([cq[~drop], wq[keep]])
            cd = np.concatenate([cd[~drop], wd[keep]])
            cr = np.concatenate([cr[~drop], wr[keep]])
    out = _select(index, queries, cq, cd, cr, k, depth, exact, metric)
    index.promote()
    return out


class _Flat:
    """All the runs' score blocks, and the scores under each query's cut-off.

    A block holds one row of scores per query of its run. Few large blocks
    (many queries a run) are thresholded one by one; many small ones (a
    query or two a run) as one flat array, whose rows (segments) keep their
    query and first entry, so a score's query and entry are found for the few
    scores selected only.
    """

    BLOCKWISE_MIN_MEAN = 4096   # mean scores a block from which blocks go one by one

    def __init__(self, owners, blocks, firsts, widths) -> None:
        self._owners, self._blocks, self._firsts = owners, blocks, firsts
        sizes = sum(d.size for d in blocks)
        self._blockwise = sizes >= self.BLOCKWISE_MIN_MEAN * len(blocks)
        if self._blockwise:
            return
        self.scores = np.concatenate([d.ravel() for d in blocks])
        counts = np.array([len(q) for q in owners])
        self._seg_len = np.repeat(np.asarray(widths), counts)
        self._seg_at = np.cumsum(self._seg_len) - self._seg_len
        self._seg_query = np.concatenate(owners)
        scalar = [np.isscalar(f) for f in firsts]
        self._seg_entry = np.repeat(np.array([f if s else -1 for f, s in zip(firsts, scalar)],
                                             dtype=np.int64), counts)
        # Shortlisted blocks name their entries one by one (rare: very large runs).
        self._explicit = None if all(scalar) else {
            int(at): np.ravel(f) for at, f, s in zip(
                self._seg_at[np.cumsum(counts) - counts], firsts, scalar) if not s}

    def under(self, cut: np.ndarray):
        """(query, score, entry) of every score at or under its query's cut-off."""
        if self._blockwise:
            cq, cd, cr = [], [], []
            for qs, d, first in zip(self._owners, self._blocks, self._firsts):
                r, c = np.nonzero(d <= cut[qs][:, None])
                cq.append(qs[r])
                cd.append(d[r, c])
                cr.append(first + c if np.isscalar(first) else first[r, c])
            return np.concatenate(cq), np.concatenate(cd), np.concatenate(cr)
        at = np.flatnonzero(self.scores <= np.repeat(cut[self._seg_query], self._seg_len))
        seg = np.searchsorted(self._seg_at, at, side="right") - 1
        entry = self._seg_entry[seg] + (at - self._seg_at[seg])
        if self._explicit is not None:
            for start, entries in self._explicit.items():
                mine = (at >= start) & (at < start + len(entries))
                entry[mine] = entries[at[mine] - start]
        return self._seg_query[seg], self.scores[at], entry


def _allowed_mask(index: VectorIndex, entries: np.ndarray,
                  allowed: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Which candidate entries (replica entries mapped to their rows) pass ``allowed``."""
    rows = index.to_rows(entries)
    union = np.unique(rows)
    return np.isin(rows, union[allowed(union)])


def _select(index: VectorIndex, queries: np.ndarray, cq: np.ndarray, cd: np.ndarray,
            cr: np.ndarray, k: int, depth: int, exact: bool, metric: str
            ) -> Tuple[np.ndarray, np.ndarray]:
    """Each query's best ``k`` of its candidates (query, score, entry), as ``[n_q, k]``."""
    n_q = len(queries)
    if index.has_replicas and len(cr):
        # A row posted twice (under its second cell too) keeps its best copy.
        cr = index.to_rows(cr)
        order = np.lexsort((cd, cr, cq))
        cq, cd, cr = cq[order], cd[order], cr[order]
        first = np.ones(len(cq), dtype=bool)
        first[1:] = (cq[1:] != cq[:-1]) | (cr[1:] != cr[:-1])
        cq, cd, cr = cq[first], cd[first], cr[first]
    if not len(cr):
        return _empty(n_q, k)
    cq, cd, cr, slot = _top_per_query(cq, cd, cr, depth if not exact else k)
    if not exact:
        # Scores from SQ8 codes: rescore the best ``depth`` with the fp32 rows
        # (which also makes their runs score exactly from now on).
        cd = _scores_of(queries[cq], index.exact_rows(cr, metric), metric)
        cq, cd, cr, slot = _top_per_query(cq, cd, cr, k)
    # The winners' distances, exactly as the metric defines them, in order.
    rows, dist = _empty(n_q, k)
    rows[cq, slot] = cr
    dist[cq, slot] = _distances_of(queries[cq], index.exact_rows(cr, metric), metric)
    order = np.argsort(dist, axis=1, kind="stable")
    rows, dist = np.take_along_axis(rows, order, 1), np.take_along_axis(dist, order, 1)
    rows[~np.isfinite(dist)] = -1
    return rows, dist


def _scores_of(queries: np.ndarray, rows: np.ndarray, metric: str) -> np.ndarray:
    """Row-wise ``_scores`` of query ``i`` and row ``i`` (same per-query constant)."""
    dots = np.einsum("ij,ij->i", queries, rows)
    return np.einsum("ij,ij->i", rows, rows) - 2 * dots if metric == "l2" else -dots


def _distances_of(queries: np.ndarray, rows: np.ndarray, metric: str) -> np.ndarray:
    """Row-wise exact distances of query ``i`` and row ``i``."""
    if metric == "l2":
        diff = rows - queries
        return np.einsum("ij,ij->i", diff, diff)
    dots = np.einsum("ij,ij->i", rows, queries)
    return 1.0 - dots if metric == "cosine" else -dots


def _pad(rows: np.ndarray, dist: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """``[queries, k]`` rows (-1) and distances (inf), padded on the right."""
    if rows.shape[1] >= k:
        return rows[:, :k], dist[:, :k]
    n_q = rows.shape[0]
    return (np.concatenate([rows, np.full((n_q, k - rows.shape[1]), -1, np.int64)], axis=1),
            np.concatenate([dist, np.full((n_q, k - rows.shape[1]), np.inf, np.float32)], axis=1))


def _empty(n_q: int, k: int) -> Tuple[np.ndarray, np.ndarray]:
    return np.full((n_q, k), -1, np.int64), np.full((n_q, k), np.inf, np.float32)


def _search_all(indexes: Sequence[VectorIndex], queries: np.ndarray, probes: np.ndarray,
                metric: str, k: int,
                allowed: Optional[Callable[[int, np.ndarray], np.ndarray]]
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best ``k`` over all superfiles: ``[Q, k]`` distances, superfiles and rows.

    A batch runs as tasks on the shared pool: one per superfile, and the
    queries split in parts when there are fewer superfiles than cores.
    """
    n_q = len(queries)

    def one(task):
        si, qs = task
        sub = None if allowed is None else (lambda rows: allowed(si, rows))
        return search_superfile(indexes[si], queries[qs], probes[qs], metric, k, sub)

    if not indexes:
        rows, dist = _empty(n_q, k)
        return dist, np.full((n_q, k), -1, np.int64), rows
    everything = slice(None)
    if n_q >= PARALLEL_MIN_QUERIES:
        pool = _pool()
        parts = max(1, min(-(-SEARCH_THREADS // len(indexes)), n_q // PARALLEL_MIN_QUERIES))
        bounds = np.linspace(0, n_q, parts + 1).astype(int)
        tasks = [(si, slice(a, b)) for si in range(len(indexes))
                 for a, b in zip(bounds[:-1], bounds[1:])]
        # One BLAS thread per search thread: the products are small, the
        # threads already fill the cores, and BLAS threads on top of them
        # spin against each other.
        with one_blas_thread():
            done = list(pool.map(one, tasks)) if len(tasks) > 1 else [one(tasks[0])]
        per_sf = []
        for si in range(len(indexes)):
            mine = done[si * parts:(si + 1) * parts]
            per_sf.append((np.concatenate([r for r, _ in mine]),
                           np.concatenate([d for _, d in mine])))
    else:
        per_sf = [one((si, everything)) for si in range(len(indexes))]
    dist = np.concatenate([d for _, d in per_sf], axis=1)
    rows = np.concatenate([r for r, _ in per_sf], axis=1)
    sfs = np.repeat(np.arange(len(per_sf)), k)[None, :].repeat(n_q, axis=0)
    return _best(dist, sfs, rows, k)


def _best(dist, sfs, rows, k):
    # Columns come ordered by superfile and, within one, by distance: a
    # stable sort breaks ties the same way whichever path found the rows.
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return (np.take_along_axis(dist, order, 1), np.take_along_axis(sfs, order, 1),
            np.take_along_axis(rows, order, 1))


def vector_search(indexes: Sequence[VectorIndex], queries: np.ndarray, probes,
                  metric: str, k: int,
                  allowed: Optional[Callable[[int, np.ndarray], np.ndarray]] = None
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query's best ``k`` over all superfiles, nearest first.

    Args:
        probes: a :class:`Probes`, or a plain ``[queries, nprobe]`` array of
            cells (every cell scored). With bounds, each query scores its
            first ``FIRST_PROBES`` cells, then only the cells whose bound is
            below its k-th distance so far.
        allowed: ``(superfile, rows) -> mask`` of the rows that may be returned.

    Returns:
        ``[queries, k]`` arrays: distances (inf pads), superfiles and rows (-1 pads).
    """
    if not isinstance(probes, Probes):
        probes = Probes(np.asarray(probes, dtype=np.int64))
    cells, bounds = probes.cells, probes.bounds
    if bounds is None or cells.shape[1] <= FIRST_PROBES or any(ix.has_replicas for ix in indexes):
        # (A replica entry is a row of another cell: a cell's bound does not hold for it.)
        return _search_all(indexes, queries, cells, metric, k, allowed)
    dist, sfs, rows = _search_all(indexes, queries, cells[:, :FIRST_PROBES], metric, k, allowed)
    kth = dist[:, k - 1]
    rest = np.where(bounds[:, FIRST_PROBES:] < kth[:, None], cells[:, FIRST_PROBES:], -1)
    todo = np.nonzero((rest >= 0).any(axis=1))[0]
    if len(todo):
        d2, s2, r2 = _search_all(indexes, queries[todo], rest[todo], metric, k, allowed)
        d, s, r = _best(np.concatenate([dist[todo], d2], axis=1),
                        np.concatenate([sfs[todo], s2], axis=1),
                        np.concatenate([rows[todo], r2], axis=1), k)
        dist[todo], sfs[todo], rows[todo] = d, s, r
    return dist, sfs, rows
