"""Search of a small table held whole in memory: a batch in a few large numpy ops.

On a small table the batched IVF search of :mod:`search` spends its time on
fixed costs, per superfile and per run (a task on the thread pool, cache
look-ups, thresholds, a rerank), not on arithmetic: on 1,800 rows it was
slower than brute force. So a table whose live vectors are small
(``DENSE_MAX_BYTES``) keeps them, exact fp32, ordered by cell
(:class:`DenseIndex`, in the handle's cache, with a transposed copy for
scoring), and a batch is answered with:

* the queries' cells (computed by the caller, one product with the grid);
* one product per probed cell, with every query that probes it (the pairs
  (query, cell) sorted by cell, so a cell's queries are one slice);
* small products land in one padded row per query (each probe's scores at a
  fixed offset, so a score's place names its row); a query's cut-off is the
  k-th of its best scores place by place over its probes, an upper bound on
  its k-th best overall that about k scores pass; those few are sorted side
  by side as int64 keys (score bits, then row), one plain sort, no argsort.
  Large products (or cells of very unequal sizes) are thresholded one by
  one instead.

Everything after the products is vectorised over all the queries: no
per-query Python, no thread pool, BLAS on the calling thread.

Scores are exact (fp32 rows, no codes), so there is no rerank; the winners'
distances are computed from their rows as the metric defines them. Deleted
rows are left out when the matrix is built (the caller keys it by the
superfiles and their deletion vectors); a filtered search takes the general
path, which checks the filter per candidate.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from beam_supertable.vector.metric import prepare, vectors_of

DENSE_MAX_BYTES = 8 << 20       # tables whose fp32 vectors (and a norm) fit this are held whole
#                                 (the index holds them twice: rows, and scoring columns)
DENSE_MIN_QUERIES = 2           # a batch this large loads a table whole; a single query never
DENSE_BLOCKWISE_MIN_MEAN = 4096  # mean scores per cell product from which each is thresholded alone
DENSE_PAD_MAX_WASTE = 6          # padded scores (cells padded to the largest) per real one, at most
PAD_CHAIN_MAX_PROBES = 4         # up to this many probes, place-by-place minima by np.minimum


class DenseIndex:
    """A small table's live vectors, grouped by cell, with where each row came from.

    Attributes:
        x: ``[n, dim]`` the prepared rows (for exact distances).
        cols_t: ``[dim + 1, n]`` scoring columns, ``(-2 x, |x|^2)`` for l2
            and ``(-x, 0)`` otherwise: ``[q, 1] @ cols_t`` is the distance
            up to a per-query constant (see ``search.scores``); a cell's
            columns are one slice, the layout its products run fastest on.
        starts: ``[n_cells + 1]``: the rows of cell ``c`` are
            ``starts[c]:starts[c + 1]``.
        superfile, row: ``[n + 1]`` each row's superfile (index into the
            entries the index was built from) and row in it, then -1.
    """

    def __init__(self, x: np.ndarray, starts: np.ndarray, superfile: np.ndarray,
                 row: np.ndarray, metric: str) -> None:
        self.x, self.starts = x, starts
        # (A -1 sentinel after the last row: a pad entry, -1, reads it.)
        self.superfile = np.append(superfile.astype(np.int64), -1)
        self.row = np.append(row.astype(np.int64), -1)
        self.cols_t = np.empty((x.shape[1] + 1, len(x)), dtype=np.float32)
        if metric == "l2":
            self.cols_t[:-1] = -2 * x.T
            self.cols_t[-1] = np.einsum("ij,ij->i", x, x)
        else:
            self.cols_t[:-1] = -x.T
            self.cols_t[-1] = 0
        self.metric = metric
        self.sizes = np.diff(starts)
        self.starts_list = starts.tolist()
        self.max_size = int(self.sizes.max()) if len(self.sizes) else 0
        self.nbytes = int(x.nbytes + self.cols_t.nbytes + starts.nbytes + self.superfile.nbytes
                          + self.row.nbytes)

    @classmethod
    def build(cls, readers: Sequence, deleted: Sequence[np.ndarray], n_cells: int,
              metric: str) -> "DenseIndex":
        """Reads every live vector of ``readers`` (superfiles of one grid).

        Args:
            readers: ``SuperfileReader`` s with vector sections.
            deleted: per reader, its deleted row numbers.
            n_cells: cells of the grid the superfiles were written on.
        """
        xs, cells, sfs, rows = [], [], [], []
        for si, (reader, dead) in enumerate(zip(readers, deleted)):
            vec = reader.header["vector"]
            n = reader.header["rows"]
            cell_of = np.full(n, -1, dtype=np.int64)
            for cell, start, count, _, _ in vec["cells"]:
                cell_of[start:start + count] = cell
            live = np.ones(n, dtype=bool)
            live[np.asarray(dead, dtype=np.int64)] = False
            live &= cell_of >= 0
            if not live.any():
                continue
            x = vectors_of(reader.read(columns=[vec["column"]]), vec["column"], vec["dim"])
            reader.ids()   # (kept by the handle: results then take their ids from it)
            keep = np.flatnonzero(live)
            xs.append(prepare(x[keep], metric))
            cells.append(cell_of[keep])
            sfs.append(np.full(len(keep), si, dtype=np.int32))
            rows.append(keep)
        dim = readers[0].header["vector"]["dim"] if readers else 0
        if not xs:
            empty = np.zeros(0, dtype=np.int64)
            return cls(np.zeros((0, dim), np.float32), np.zeros(n_cells + 1, np.int64),
                       empty.astype(np.int32), empty, metric)
        cell = np.concatenate(cells)
        order = np.argsort(cell, kind="stable")
        starts = np.searchsorted(cell[order], np.arange(n_cells + 1)).astype(np.int64)
        return cls(np.concatenate(xs)[order], starts, np.concatenate(sfs)[order],
                   np.concatenate(rows)[order], metric)

    def search(self, queries: np.ndarray, cells: np.ndarray, k: int
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each query's best ``k`` rows of its cells, nearest first.

        Args:
            queries: ``[Q, dim]`` prepared queries.
            cells: ``[Q, P]`` the cells each query probes, distinct in a row
                (-1: none).

        Returns:
            ``[Q, k]`` exact distances (inf pads), superfiles and rows (-1 pads).
        """
        n_q = len(queries)
        if not len(self.x):
            return (np.full((n_q, k), np.inf, np.float32), np.full((n_q, k), -1, np.int64),
                    np.full((n_q, k), -1, np.int64))
        cells = np.asarray(cells, dtype=np.int64)
        aug = np.empty((n_q, queries.shape[1] + 1), dtype=np.float32)
        aug[:, :-1], aug[:, -1] = queries, 1.0
        if n_q == 1:
            # One query: its rows' scoring rows (gathered by row: a gather of
            # columns of ``cols_t`` is slow) and one product.
            mine = cells[0][cells[0] >= 0]
            idx = _ranges(self.starts[mine], self.sizes[mine])
            rows = np.empty((len(idx), self.x.shape[1] + 1), dtype=np.float32)
            np.multiply(self.x.take(idx, axis=0), -2 if self.metric == "l2" else -1,
                        out=rows[:, :-1])
            rows[:, -1] = self.cols_t[-1, idx]
            scores = rows @ aug[0]
            top = np.full((1, k), -1, dtype=np.int64)
            best = np.argsort(scores, kind="stable")[:k]
            top[0, :len(best)] = idx[best]
            return self._ranked(queries, top)
        return self._ranked(queries, self._batch(aug, cells, k))

    def _batch(self, aug: np.ndarray, cells: np.ndarray, k: int) -> np.ndarray:
        """``[Q, k]``: the entries of each query's best ``k`` scores, best first (-1 pads).

        Pairs (query, probed cell) are sorted by cell, so each cell's queries
        are one slice, scored with one product. Ties between equal scores go
        to the lower entry (see ``_keys``).
        """
        n_q, width = cells.shape
        flat_cells = cells.ravel()
        # (A stable sort of 16-bit keys is a radix sort: twice as fast.)
        keys = flat_cells.astype(np.int16) if len(self.sizes) < 1 << 15 else flat_cells
        counts = np.bincount(flat_cells + 1, minlength=len(self.sizes) + 1)
        order = np.argsort(keys, kind="stable")[counts[0]:]     # (-1 probes sort first)
        counts = counts[1:]
        used = np.flatnonzero(counts)
        ends = np.cumsum(counts)[used]
        total = int(counts @ self.sizes)
        runs = ((ends - counts[used]).tolist(), ends.tolist(), used.tolist())
        if not total:
            return np.full((n_q, k), -1, dtype=np.int64)
        if total < DENSE_BLOCKWISE_MIN_MEAN * len(used) and \
                n_q * width * self.max_size <= DENSE_PAD_MAX_WASTE * total:
            return self._padded(aug, cells, order, runs, k)
        return self._blockwise(aug, order // width, order % width == 0, runs, k)

    def _padded(self, aug: np.ndarray, cells: np.ndarray, order: np.ndarray, runs, k: int
                ) -> np.ndarray:
        """``_batch`` for small products: every query's scores in one padded row.

        Row ``q`` holds, for each of its probes ``p``, the scores of that
        cell's rows at ``p * max_size`` on (inf past the cell's end), so the
        position of a score names its entry. The cut-off of a query is the
        k-th smallest of its best scores place by place (the minimum over
        its probes at each offset): ``k`` distinct rows score at most that,
        so it bounds the k-th best from above, and tightly (about ``k``
        scores pass it); when no probed cell holds ``k`` rows it is the
        k-th of all the query's scores. The few scores under it are sorted
        side by side.
        """
        n_q, width = cells.shape
        size, n_pairs = self.max_size, len(order)
        # Products into rows in pair order (cell by cell, each a slice),
        # then one gather puts them in query order; -1 probes take the last,
        # empty, row.
        by_cell = np.full((n_pairs + 1, size), np.inf, dtype=np.float32)
        aug_pairs = aug[order // width]
        starts, cols_t = self.starts_list, self.cols_t
        for lo, hi, c in zip(*runs):
            a, b = starts[c], starts[c + 1]
            np.matmul(aug_pairs[lo:hi], cols_t[:, a:b], out=by_cell[lo:hi, :b - a])
        place = np.full(n_q * width, n_pairs, dtype=np.int64)
        place[order] = np.arange(n_pairs)
        scored = by_cell[place].reshape(n_q, width * size)
        big = _BIG
        if size >= k:
            by_probe = scored.reshape(n_q, width, size)
            if width <= PAD_CHAIN_MAX_PROBES:
                least = np.minimum(by_probe[:, 0], by_probe[:, 1]) if width > 1 else \
                    by_probe[:, 0].copy()
                for p in range(2, width):
                    np.minimum(least, by_probe[:, p], out=least)
            else:
                least = by_probe.min(axis=1)
            least.sort(axis=1)                  # (a SIMD sort: faster than a partition here)
            cut = least[:, k - 1].copy()
        else:
            cut = np.full(n_q, np.inf, dtype=np.float32)
        open_ = np.flatnonzero(cut > big)
        if len(open_):
            # No probed cell of k rows: the k-th of all the query's scores.
            cut[open_] = np.partition(scored[open_], k - 1, axis=1)[:, k - 1] \
                if width * size >= k else np.inf
            np.minimum(cut, big, out=cut)   # (never the pads)
        hit = np.flatnonzero(scored <= cut[:, None])
        pair = hit // size                  # (query * width + probe)
        entries = self.starts[cells].ravel()[pair] + (hit - pair * size)
        q_of = pair // width
        return _top_per_query(q_of, scored.ravel()[hit], entries, n_q, k, by_query=True)

    def _blockwise(self, aug: np.ndarray, qs: np.ndarray, lead: np.ndarray, runs, k: int
                   ) -> np.ndarray:
        """``_batch`` for large products (or cells of very unequal sizes): each thresholded alone.

        A query's cut-off is the k-th best score in its nearest cell (any
        other cell of ``k`` rows or more gives one when the nearest is
        smaller).
        """
        n_q = len(aug)
        starts, cols_t = self.starts_list, self.cols_t
        aug_pairs = aug[qs]
        cut = np.full(n_q, np.inf, dtype=np.float32)
        blocks = []
        for lo, hi, c in zip(*runs):
            a, b = starts[c], starts[c + 1]
            block = aug_pairs[lo:hi] @ cols_t[:, a:b]
            blocks.append(block)
            if b - a >= k:
                mine = qs[lo:hi]
                need = lead[lo:hi] | np.isinf(cut[mine])
                if need.any():
                    kth = np.partition(block[need], k - 1, axis=1)[:, k - 1]
                    cut[mine[need]] = np.minimum(cut[mine[need]], kth)
        got_q, got_v, got_e = [], [], []
        for lo, hi, c, block in zip(*runs, blocks):
            r, col = np.nonzero(block <= cut[qs[lo:hi]][:, None])
            got_q.append(qs[lo:hi][r])
            got_v.append(block[r, col])
            got_e.append(starts[c] + col)
        q_of, vals, entries = (np.concatenate(p) for p in (got_q, got_v, got_e))
        return _top_per_query(q_of, vals, entries, n_q, k)

    def _ranked(self, queries: np.ndarray, entries: np.ndarray
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[Q, k]`` (distance, superfile, row) of the winners ``entries`` (-1 pads), nearest first.

        Distances are computed from the rows, as the metric defines them.
        """
        # (A pad's -1 reads the last row; its distance is replaced below.)
        x = self.x.take(entries.ravel(), axis=0).reshape(entries.shape + (-1,))
        if self.metric == "l2":
            x -= queries[:, None, :]
            dist = np.einsum("qkd,qkd->qk", x, x)
        else:
            dots = np.einsum("qkd,qd->qk", x, queries)
            dist = 1.0 - dots if self.metric == "cosine" else -dots
        pads = entries < 0
        if pads.any():
            dist[pads] = np.inf
        order = np.argsort(dist, axis=1, kind="stable")
        order += np.arange(0, order.size, order.shape[1])[:, None]   # (flat positions)
        dist, entries = dist.ravel()[order], entries.ravel()[order]
        return dist, self.superfile[entries], self.row[entries]


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, sizes)])``, in one go."""
    total = int(sizes.sum())
    base = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return base + np.arange(total)


def _keys(vals: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """int64 sort keys ordering ``(vals, entries)`` as pairs: score first, then entry.

    A float32's bits, with the magnitude bits of negatives flipped, order as
    the floats do (-0.0 is made +0.0 first, so the two tie); the entry (under
    2**31: the held rows are far fewer) fills the low half. One plain sort of
    the keys then is a stable sort of the scores by entry, with no argsort.
    """
    bits = (vals + np.float32(0)).view(np.int32)
    bits = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))
    return (bits.astype(np.int64) << 32) | entries


_NO_KEY = np.iinfo(np.int64).max
_BIG = np.float32(np.finfo(np.float32).max)   # (finfo costs microseconds a call)


def _top_per_query(q_of: np.ndarray, vals: np.ndarray, entries: np.ndarray, n_q: int, k: int,
                   by_query: bool = False) -> np.ndarray:
    """``[n_q, k]``: each query's ``k`` entries of lowest finite ``vals``, best first (-1 pads).

    Equal values go to the lower entry.

    Args:
        by_query: ``q_of`` is sorted already.
    """
    if not by_query:
        keep = np.isfinite(vals)
        q_of, vals, entries = q_of[keep], vals[keep], entries[keep]
        order = np.argsort(q_of, kind="stable")
        q_of, vals, entries = q_of[order], vals[order], entries[order]
    if not len(q_of):
        return np.full((n_q, k), -1, dtype=np.int64)
    counts = np.bincount(q_of, minlength=n_q)
    width = max(int(counts.max()), k)
    # The few kept of each query, side by side: one sort along the rows.
    keys = np.full((n_q, width), _NO_KEY, dtype=np.int64)
    first = np.cumsum(counts) - counts
    keys.ravel()[np.arange(len(q_of)) + (q_of * width - first[q_of])] = _keys(vals, entries)
    keys.sort(axis=1)
    # The entry is the low half; a pad's low half (all ones) reads as -1 in int32.
    return (keys[:, :k] & 0xFFFFFFFF).astype(np.int32).astype(np.int64)


def usable(rows: int, dim: int) -> bool:
    """Whether a table of ``rows`` vectors of ``dim`` values is searched held whole.

    Judged by the table's size alone, so that a batch's answer never
    depends on the handle (its cache budget).
    """
    return rows * (dim + 1) * 4 <= DENSE_MAX_BYTES
