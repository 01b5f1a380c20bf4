"""Search of a small table held whole in memory: a batch in a few large numpy ops.

On a small table the batched IVF search of :mod:`search` spends its time on
fixed costs, per superfile and per run (a task on the thread pool, cache
look-ups, thresholds, a rerank), not on arithmetic: on 1,800 rows it was
slower than brute force. So a table whose live vectors are small
(``DENSE_MAX_BYTES``) keeps them, exact fp32, in one matrix ordered by cell
(:class:`DenseIndex`, in the handle's cache), and a batch is answered with:

* the queries' cells (computed by the caller, one product with the grid);
* one product per probed cell, with every query that probes it, written into
  a padded ``[queries, candidates]`` matrix (each query's cells side by side);
* a vectorised top-k of that matrix: the k-th smallest of per-block minima is
  an upper bound on each query's k-th score, and only the scores under it
  (a few per query) are sorted.

Scores are exact (fp32 rows, no codes), so there is no rerank; the winners'
distances are computed from their rows as the metric defines them. Deleted
rows are left out when the matrix is built (it is keyed by the deletion
vectors of the version), so only a filter needs a per-row check, which the
caller does on the winners and widens from.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from beam_supertable.superfile import vectors_of
from beam_supertable.vector.metric import prepare

DENSE_MAX_BYTES = 32 << 20      # tables whose fp32 vectors (and a norm) fit this are held whole
DENSE_CACHE_SHARE = 8           # ... and take at most this share of the handle's cache budget
DENSE_MIN_QUERIES = 8           # a cold table is loaded whole only for a batch this large
TOPK_GROUPS_PER_K = 4           # _top_k: groups of columns per result wanted


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
        sizes = np.where(cells >= 0, self.sizes[np.maximum(cells, 0)], 0)
        ends = np.cumsum(sizes, axis=1)
        offs = ends - sizes                       # where each cell's scores start in its query's row
        width = max(int(ends[:, -1].max()) if n_q else 0, 1)
        aug = np.empty((n_q, queries.shape[1] + 1), dtype=np.float32)
        aug[:, :-1], aug[:, -1] = queries, 1.0
        scored = np.full((n_q, width), np.inf, dtype=np.float32)
        if n_q == 1:
            # One query: gather its rows and score them with one product.
            mine = sizes[0] > 0
            idx = _ranges(self.starts[cells[0, mine]], sizes[0, mine])
            scored[0, :len(idx)] = self.cols[idx] @ aug[0]
        else:
            # Pairs (query, probed cell) sorted by cell: each cell's queries
            # are then one slice, scored with one product, and every score's
            # place in the padded matrix is known before the loop.
            flat_cells = cells.ravel()
            order = np.argsort(flat_cells, kind="stable")
            order = order[flat_cells[order] >= 0]
            pair_cells = flat_cells[order]
            qs = order // cells.shape[1]
            lens = self.sizes[pair_cells]
            at = _ranges(qs * width + offs.ravel()[order], lens)
            firsts = np.flatnonzero(np.diff(pair_cells, prepend=-1))
            lasts = np.append(firsts[1:], len(order)).tolist()
            aug_pairs = aug[qs]
            starts, cols = self.starts.tolist(), self.cols
            blocks = [aug_pairs[lo:hi] @ cols[starts[c]:starts[c + 1]].T
                      for lo, hi, c in zip(firsts.tolist(), lasts, pair_cells[firsts].tolist())]
            scored.reshape(-1)[at] = np.concatenate([b.ravel() for b in blocks])
        q_of, pos = _top_k(scored, k)
        slot = (offs[q_of] <= pos[:, None]).sum(axis=1) - 1
        entries = self.starts[cells[q_of, slot]] + (pos - offs[q_of, slot])
        return self._ranked(queries, q_of, entries, n_q, k)

    def _ranked(self, queries, q_of, entries, n_q, k):
        """``[n_q, k]`` (distance, superfile, row) of the winners, nearest first."""
        x = self.vectors(entries)
        q = queries[q_of]
        if self.metric == "l2":
            diff = x - q
            d = np.einsum("ij,ij->i", diff, diff)
        else:
            dots = np.einsum("ij,ij->i", x, q)
            d = 1.0 - dots if self.metric == "cosine" else -dots
        dist = np.full((n_q, k), np.inf, dtype=np.float32)
        ent = np.full((n_q, k), -1, dtype=np.int64)
        counts = np.bincount(q_of, minlength=n_q)
        slot = np.arange(len(q_of)) - np.repeat(np.cumsum(counts) - counts, counts)
        dist[q_of, slot], ent[q_of, slot] = d, entries
        order = np.argsort(dist, axis=1, kind="stable")
        dist, ent = np.take_along_axis(dist, order, 1), np.take_along_axis(ent, order, 1)
        ok = ent >= 0
        sfs = np.where(ok, self.superfile[np.maximum(ent, 0)], -1).astype(np.int64)
        rows = np.where(ok, self.row[np.maximum(ent, 0)], -1)
        return dist, sfs, rows


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, sizes)])``, in one go."""
    total = int(sizes.sum())
    base = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return base + np.arange(total)


def _top_k(scored: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """(query, column) of each query's ``k`` smallest finite scores, by query then score.

    The columns are dealt into ``k * TOPK_GROUPS_PER_K`` groups (column mod
    groups); the k-th smallest of the group minima bounds each query's k-th
    smallest score from above (k groups hold a score at most that), so only
    the scores at or under it, a few per query, are sorted. Ties keep the
    column order.
    """
    n_q, width = scored.shape
    groups = k * TOPK_GROUPS_PER_K
    if width >= 2 * groups:
        per = width // groups
        mins = scored[:, :per * groups].reshape(n_q, per, groups).min(axis=1)
        cut = np.partition(mins, k - 1, axis=1)[:, k - 1]
        hit = np.flatnonzero(scored <= cut[:, None])
    else:
        hit = np.flatnonzero(np.isfinite(scored))
    q_of = hit // width
    pos = hit - q_of * width
    if not len(q_of):
        return q_of, pos
    vals = scored[q_of, pos]
    counts = np.bincount(q_of, minlength=n_q)
    slot = np.arange(len(q_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    # The few selected of each query, side by side: one sort along the rows.
    pad_val = np.full((n_q, int(counts.max())), np.inf, dtype=np.float32)
    pad_pos = np.full(pad_val.shape, -1, dtype=np.int64)
    pad_val[q_of, slot], pad_pos[q_of, slot] = vals, pos
    order = np.argsort(pad_val, axis=1, kind="stable")[:, :k]
    top_val = np.take_along_axis(pad_val, order, 1)
    q_of, slot = np.nonzero(np.isfinite(top_val))
    return q_of, np.take_along_axis(pad_pos, order, 1)[q_of, slot]


def usable(rows: int, dim: int, capacity_bytes: int) -> bool:
    """Whether a table of ``rows`` live vectors of ``dim`` values is held whole."""
    need = rows * (dim + 1) * 4
    return need <= DENSE_MAX_BYTES and need * DENSE_CACHE_SHARE <= capacity_bytes

