"""Search of a small table held whole in memory: a batch in a few large numpy ops.

On a small table the batched IVF search of :mod:`search` spends its time on
fixed costs, per superfile and per run (a task on the thread pool, cache
look-ups, thresholds, a rerank), not on arithmetic: on 1,800 rows it was
slower than brute force. So a table whose live vectors are small
(``DENSE_MAX_BYTES``) keeps them, exact fp32, in one matrix ordered by cell
(:class:`DenseIndex`, in the handle's cache), and a batch is answered with:

* the queries' cells (computed by the caller, one product with the grid);
* one product per probed cell, with every query that probes it (the pairs
  (query, cell) sorted by cell, so a cell's queries are one slice);
* a cut-off per query, the k-th best score in its nearest cell (an upper
  bound on its k-th best overall), so only the scores under it, a few per
  query, are kept; they are sorted side by side in one padded matrix.

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

from beam_supertable.superfile import vectors_of
from beam_supertable.vector.metric import prepare

DENSE_MAX_BYTES = 8 << 20       # tables whose fp32 vectors (and a norm) fit this are held whole
DENSE_MIN_QUERIES = 2           # a batch this large loads a table whole; a single query never
DENSE_BLOCKWISE_MIN_MEAN = 4096  # mean scores per cell product from which each is thresholded alone


class DenseIndex:
    """A small table's live vectors, grouped by cell, with where each row came from.

    Attributes:
        cols: ``[n, dim + 1]`` scoring rows, ``(-2 x, |x|^2)`` for l2 and
            ``(-x, 0)`` otherwise: ``[q, 1] @ cols.T`` is the distance up
            to a per-query constant (see ``search.scores``).
        starts: ``[n_cells + 1]``: the rows of cell ``c`` are
            ``starts[c]:starts[c + 1]``.
        superfile, row: ``[n]`` each row's superfile (index into the
            entries the index was built from) and row in it.
    """

    def __init__(self, cols: np.ndarray, starts: np.ndarray, superfile: np.ndarray,
                 row: np.ndarray, metric: str) -> None:
        self.cols, self.starts, self.superfile, self.row = cols, starts, superfile, row
        self.metric = metric
        self.sizes = np.diff(starts)
        self.nbytes = int(cols.nbytes + starts.nbytes + superfile.nbytes + row.nbytes)

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
            keep = np.flatnonzero(live)
            xs.append(prepare(x[keep], metric))
            cells.append(cell_of[keep])
            sfs.append(np.full(len(keep), si, dtype=np.int32))
            rows.append(keep)
        dim = readers[0].header["vector"]["dim"] if readers else 0
        if not xs:
            empty = np.zeros(0, dtype=np.int64)
            return cls(np.zeros((0, dim + 1), np.float32), np.zeros(n_cells + 1, np.int64),
                       empty.astype(np.int32), empty, metric)
        cell = np.concatenate(cells)
        order = np.argsort(cell, kind="stable")
        x = np.concatenate(xs)[order]
        cols = np.empty((len(x), dim + 1), dtype=np.float32)
        if metric == "l2":
            cols[:, :-1] = -2 * x
            cols[:, -1] = np.einsum("ij,ij->i", x, x)
        else:
            cols[:, :-1] = -x
            cols[:, -1] = 0
        starts = np.searchsorted(cell[order], np.arange(n_cells + 1)).astype(np.int64)
        return cls(cols, starts, np.concatenate(sfs)[order], np.concatenate(rows)[order], metric)

    def vectors(self, entries: np.ndarray) -> np.ndarray:
        """The prepared vectors of ``entries`` (exactly: the scaling is by a power of two)."""
        return self.cols[entries, :-1] * np.float32(-0.5 if self.metric == "l2" else -1.0)

    def search(self, queries: np.ndarray, cells: np.ndarray, k: int
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each query's best ``k`` rows of its cells, nearest first.

        Args:
            queries: ``[Q, dim]`` prepared queries.
            cells: ``[Q, P]`` the cells each query probes (-1: none).

        Returns:
            ``[Q, k]`` exact distances (inf pads), superfiles and rows (-1 pads).
        """
        n_q = len(queries)
        cells = np.asarray(cells, dtype=np.int64)
        aug = np.empty((n_q, queries.shape[1] + 1), dtype=np.float32)
        aug[:, :-1], aug[:, -1] = queries, 1.0
        if n_q == 1:
            # One query: gather its rows and score them with one product.
            mine = cells[0][cells[0] >= 0]
            idx = _ranges(self.starts[mine], self.sizes[mine])
            scores = self.cols[idx] @ aug[0]
            top = np.full((1, k), -1, dtype=np.int64)
            best = np.argsort(scores, kind="stable")[:k]
            top[0, :len(best)] = idx[best]
            return self._ranked(queries, top)
        return self._ranked(queries, self._batch(aug, cells, k))

    def _batch(self, aug: np.ndarray, cells: np.ndarray, k: int) -> np.ndarray:
        """``[Q, k]``: the entries of each query's best ``k`` scores, best first (-1 pads).

        Pairs (query, probed cell) are sorted by cell, so each cell's queries
        are one slice, scored with one product. A query's cut-off is the
        k-th best score in its nearest cell (an upper bound on its k-th best
        overall; any other cell of ``k`` rows or more gives one when the
        nearest is smaller); only the scores under it are kept and sorted.
        """
        n_q, width = cells.shape
        flat_cells = cells.ravel()
        order = np.argsort(flat_cells, kind="stable")
        order = order[flat_cells[order] >= 0]
        pair_cells = flat_cells[order]
        qs = order // width
        lead = order % width == 0
        firsts = np.flatnonzero(np.diff(pair_cells, prepend=-1)).tolist()
        lasts = firsts[1:] + [len(order)]
        aug_pairs = aug[qs]
        starts, cols = self.starts.tolist(), self.cols
        lens = self.sizes[pair_cells]
        blockwise = len(order) and lens.sum() >= DENSE_BLOCKWISE_MIN_MEAN * len(firsts)
        cut = np.full(n_q, np.inf, dtype=np.float32)
        blocks = []
        for lo, hi, c in zip(firsts, lasts, pair_cells[firsts].tolist()):
            a, b = starts[c], starts[c + 1]
            block = aug_pairs[lo:hi] @ cols[a:b].T
            blocks.append(block)
            if blockwise and b - a >= k:
                mine = qs[lo:hi]
                need = lead[lo:hi] | np.isinf(cut[mine])
                if need.any():
                    kth = np.partition(block[need], k - 1, axis=1)[:, k - 1]
                    cut[mine[need]] = np.minimum(cut[mine[need]], kth)
        if blockwise:
            # Large products: each thresholded on its own.
            got_q, got_v, got_e = [], [], []
            for lo, hi, c, block in zip(firsts, lasts, pair_cells[firsts].tolist(), blocks):
                r, col = np.nonzero(block <= cut[qs[lo:hi]][:, None])
                got_q.append(qs[lo:hi][r])
                got_v.append(block[r, col])
                got_e.append(starts[c] + col)
            q_of, vals, entries = (np.concatenate(p) for p in (got_q, got_v, got_e))
        else:
            # Small products: all the scores as one flat array, pair by pair;
            # the cut-offs from the nearest cells' scores, side by side.
            flat = np.concatenate([blk.ravel() for blk in blocks]) if blocks else \
                np.zeros(0, np.float32)
            seg = np.cumsum(lens) - lens
            if len(order):
                firsts_of = seg[lead]
                n_lead = lens[lead]
                pad = np.full((n_q, max(int(n_lead.max()), k)), np.inf, dtype=np.float32)
                at = _ranges(firsts_of, n_lead)
                pad[np.repeat(qs[lead], n_lead), at - np.repeat(firsts_of, n_lead)] = flat[at]
                cut = np.partition(pad, k - 1, axis=1)[:, k - 1]
            hit = np.flatnonzero(flat <= np.repeat(cut[qs], lens))
            pair = np.searchsorted(seg, hit, side="right") - 1
            q_of, vals = qs[pair], flat[hit]
            entries = self.starts[pair_cells[pair]] + (hit - seg[pair])
        return _top_per_query(q_of, vals, entries, n_q, k)

    def _ranked(self, queries: np.ndarray, entries: np.ndarray
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[Q, k]`` (distance, superfile, row) of the winners ``entries`` (-1 pads), nearest first.

        Distances are computed from the rows, as the metric defines them.
        """
        ok = entries >= 0
        x = self.vectors(np.where(ok, entries, 0).ravel()).reshape(entries.shape + (-1,))
        if self.metric == "l2":
            diff = x - queries[:, None, :]
            d = np.einsum("qkd,qkd->qk", diff, diff)
        else:
            dots = np.einsum("qkd,qd->qk", x, queries)
            d = 1.0 - dots if self.metric == "cosine" else -dots
        dist = np.where(ok, d, np.inf).astype(np.float32)
        order = np.argsort(dist, axis=1, kind="stable")
        dist, entries = np.take_along_axis(dist, order, 1), np.take_along_axis(entries, order, 1)
        ok = entries >= 0
        at = np.where(ok, entries, 0)
        return (dist, np.where(ok, self.superfile[at], -1).astype(np.int64),
                np.where(ok, self.row[at], -1))


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, sizes)])``, in one go."""
    total = int(sizes.sum())
    base = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return base + np.arange(total)


def _top_per_query(q_of: np.ndarray, vals: np.ndarray, entries: np.ndarray, n_q: int, k: int
                   ) -> np.ndarray:
    """``[n_q, k]``: each query's ``k`` entries of lowest finite ``vals``, best first (-1 pads)."""
    keep = np.isfinite(vals)
    q_of, vals, entries = q_of[keep], vals[keep], entries[keep]
    top = np.full((n_q, k), -1, dtype=np.int64)
    if not len(q_of):
        return top
    order = np.argsort(q_of, kind="stable")
    q_of, vals, entries = q_of[order], vals[order], entries[order]
    counts = np.bincount(q_of, minlength=n_q)
    slot = np.arange(len(q_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    # The few kept of each query, side by side: one sort along the rows.
    pad_val = np.full((n_q, int(counts.max())), np.inf, dtype=np.float32)
    pad_ent = np.full(pad_val.shape, -1, dtype=np.int64)
    pad_val[q_of, slot], pad_ent[q_of, slot] = vals, entries
    order = np.argsort(pad_val, axis=1, kind="stable")[:, :k]
    top[:, :order.shape[1]] = np.take_along_axis(pad_ent, order, 1)
    return top


def usable(rows: int, dim: int) -> bool:
    """Whether a table of ``rows`` vectors of ``dim`` values is searched held whole.

    Judged by the table's size alone, so that a batch's answer never
    depends on the handle (its cache budget).
    """
    return rows * (dim + 1) * 4 <= DENSE_MAX_BYTES
