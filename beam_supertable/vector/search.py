"""Batched IVF search over superfiles: probe cells, score codes, rerank exactly.

Queries are processed together: for each superfile, every probed cell (or
fine run) is decoded once and scored against all the queries that probe it;
each query keeps its best SQ8 candidates, which are then reranked exactly
with the fp32 vectors read from the Parquet data. Unfiltered searches score
every run in one compiled call (:func:`kernels.scan_topk`: the top kept
inside it, the GIL released); filtered ones, and cells with replicas, run by
run with one matrix product each (``COMPILED_SCAN`` turns the compiled scan off).

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

import dataclasses
import math
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from beam_supertable.vector import codes
from beam_supertable.vector._threads import SEARCH_THREADS, _pool, blas_controller, one_blas_thread  # noqa: F401
from beam_supertable.vector.calibrate import check_target
from beam_supertable.vector.index import EXACT_FIRST_RUNS, VectorIndex  # noqa: F401
from beam_supertable.vector.metric import bisector_bounds, nearest

RERANK_PER_K = 3                 # SQ8 candidates reranked exactly, per requested k
SHORTLIST_MIN_ENTRIES = 16_384   # runs larger than this are shortlisted by 1-bit codes
SHORTLIST_SHARE = 0.25
FINE_PROBE_SHARE = 0.5
PARALLEL_MIN_QUERIES = 16        # smaller batches run inline: threads cost more than they save
FIRST_PROBES = 1                 # cells every query scores before bounds may skip the rest
COMPILED_SCAN = True             # unfiltered runs scan in one compiled call (kernels.scan_topk)


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
    from beam_supertable.vector import kernels   # (numba: imported on first use)

    return kernels.hamming_topk(qbits, bits, keep)


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
    if not exact:
        index.load_codes([(run[0], run[1]) for run, _, _, _ in runs])
    depth = k if exact else k * RERANK_PER_K
    warm = index.scoring_store() if exact else None   # every run loaded: no per-run checks
    if COMPILED_SCAN and allowed is None and not index.has_replicas \
            and all(r[1] - r[0] <= SHORTLIST_MIN_ENTRIES for r, _, _, _ in runs):
        found = _scan_compiled(index, augmented, runs, depth, warm)
        if found is not None:
            out = _select(index, queries, *found, k, depth, exact, metric)
            index.promote()
            return out
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


def _scan_compiled(index: VectorIndex, augmented: np.ndarray, runs, depth: int,
                   warm: Optional[np.ndarray]):
    """Every query's ``depth`` best (query, score, entry) over its runs, by the compiled
    scan (:func:`kernels.scan_topk`): one call for all runs and queries, the top
    kept inside it. None when the stores were replaced while the runs loaded
    (the handle's budget filled up): the caller then scores run by run.
    """
    store = warm if warm is not None else index.scoring_store()
    starts, stops, qids = [], [], []
    for run, qs, _, _ in runs:
        start, stop, _ = run
        if stop <= start:
            continue
        if warm is None:
            index.scoring_rows(start, stop)    # loads the run (and counts its scoring)
        starts.append(start)
        stops.append(stop)
        qids.append(qs)
    if warm is None and index.scoring_store() is not store:
        return None
    n_q = len(augmented)
    if not starts:
        return np.empty(0, np.int64), np.empty(0, np.float32), np.empty(0, np.int64)
    qptr = np.concatenate([[0], np.cumsum([len(q) for q in qids])])
    from beam_supertable.vector import kernels   # (numba: imported on first use)

    scored, entries, counts = kernels.scan_topk(augmented, store, np.asarray(starts), np.asarray(stops),
                                                qptr, np.concatenate(qids), depth)
    filled = np.arange(depth)[None, :] < counts[:, None]
    return np.repeat(np.arange(n_q), counts), scored[filled], entries[filled]


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
