"""Probe laws: how many cells a query must probe to reach a recall target.

A fixed ``nprobe`` suits one data shape only: well-separated clusters need one
or two cells, embeddings of real text need many more. So the table measures,
on held-out rows of its own data, the share of each query's true top-10 that
lies in its ``p`` nearest cells, for a ladder of ``p`` -- the *probe law* --
and stamps it into the manifest as the table property ``probe_law``. Search
reads the smallest ``p`` whose measured recall reaches the caller's target.

How a law is measured (:func:`measure`): from a uniform sample of at most
``CALIBRATION_SAMPLE_ROWS`` of the written rows, ``CALIBRATION_QUERIES`` are
held out as queries; each query's true neighbours among the other sampled
rows are found by brute force. In a sample holding a share ``f`` of the rows,
a query's nearest ``LAW_K * f`` sampled rows stand for its nearest ``LAW_K``
in the table (a random subset of about them), so the law measures recall@10
at the table's density at a fraction of a full brute-force pass. Each
neighbour's cell is its nearest centroid, the rule the writer uses, and it
counts as found at ``p`` when its cell is among the query's ``p`` nearest
centroids. The law keeps the mean and the standard error over queries at
every ladder point; a target is reached where
``mean - LAW_Z * stderr - SEARCH_LOSS >= target`` (``SEARCH_LOSS`` covers
what scoring with 8-bit codes can lose once the cells are chosen). It also
keeps, per ladder point, the share of cells that the distance bound of
adaptive probing (``metric.bisector_bounds``) would let a query skip; search
probes adaptively where that share is worth a second pass.

When (:func:`due`, :class:`CommitLaw`): at the first vector commit, when
the grid changes, and when the table has grown ``REGROW_FACTOR`` times since
the law was measured, judged on the base the commit lands on (a commit
rebuilt on a newer base after a lost race is judged again there); the
commit's own rows are measured (sampled in the writer's memory, or read back
from its new superfiles). A new measurement is merged with the old law of the same
grid, weighted by rows (:func:`merge`), so a table whose new rows have another
shape gets a law for the mixture. A law is a replaceable stamp: a concurrent
writer's law is overwritten, never a conflict. A table written by many small
commits is measured at the density of one commit, which errs on the side of
probing more.

JSON form (the table property ``probe_law``)::

    {"format": 1, "grid": "<sha256 of the grid>", "n_cells": 1118, "k": 10,
     "rows": 200000, "queries": 1024,
     "nprobe": [1, 2, 3, ...],           # the ladder: 1..16, then ~12.5 % steps
     "recall": [0.94, 0.99, ...],        # mean recall@10 at each ladder point
     "stderr": [0.006, 0.002, ...],      # its standard error
     "prunable": [0.0, 0.02, ...],       # share of cells the bound skips
     "targets": {"0.9": 1, "0.95": 2, "0.99": 3}}

``targets`` repeats, for reading by eye, what :meth:`ProbeLaw.nprobe_for` gives.
Tables without a law (written before laws existed, or without a vector
commit yet) probe :func:`fallback_nprobe` cells.

This module does no I/O: vectors in, JSON data out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from beam_supertable.vector.metric import bisector_bounds, distances, nearest, prepare

__all__ = [
    "DEFAULT_RECALL_TARGET", "LAW_PROPERTY", "CommitLaw", "ProbeLaw", "due", "fallback_nprobe",
    "law_for_commit", "measure", "merge", "nprobe_for_target",
]

LAW_PROPERTY = "probe_law"
LAW_FORMAT = 1
LAW_K = 10                        # the law is for recall@10
DEFAULT_RECALL_TARGET = 0.95
TARGETS = (0.9, 0.95, 0.99)       # shown in the law's "targets"
CALIBRATION_QUERIES = 1024        # held-out rows measured per calibration
CALIBRATION_SAMPLE_ROWS = 32_768  # rows searched by brute force for the true neighbours ...
SAMPLE_NEIGHBOURS = 3             # ... fewer, so that a query's stand-ins are 3 rows ...
MIN_SAMPLE_ROWS = 4_096           # ... unless that would leave fewer than this
PRUNABLE_QUERIES = 256            # queries the adaptive probing's share is measured on
REGROW_FACTOR = 2.0               # recalibrate when the table has grown this much
LAW_Z = 1.0                       # standard errors kept below a target (the sample's noise)
SEARCH_LOSS = 0.005               # recall 8-bit scoring may lose after the cells are chosen
ADAPTIVE_MIN_SHARE = 0.25         # probe adaptively when bounds skip this share of the cells
NPROBE_PER_SQRT_CELL = 0.45       # the fallback: ceil(0.45 * sqrt(n_cells)) cells
LADDER_DENSE = 16                 # every p up to this; then steps of LADDER_STEP
LADDER_STEP = 1.125
SEED = 0


def fallback_nprobe(n_cells: int) -> int:
    """Cells probed on a table without a law: ``ceil(0.45 * sqrt(n_cells))``.

    Tuned on overlapping Gaussian clusters; other shapes need a measured law.
    """
    return max(1, min(n_cells, math.ceil(NPROBE_PER_SQRT_CELL * math.sqrt(n_cells))))


def ladder(n_cells: int) -> Tuple[int, ...]:
    """The probe counts a law is measured at: 1..16, then ~12.5 % steps, then all cells."""
    steps = set(range(1, min(n_cells, LADDER_DENSE) + 1))
    p = float(LADDER_DENSE)
    while p < n_cells:
        p *= LADDER_STEP
        steps.add(min(n_cells, int(math.ceil(p))))
    steps.add(n_cells)
    return tuple(sorted(steps))


def check_target(target: float) -> float:
    """A recall target in (0, 1]; raises ValueError naming the value otherwise."""
    if isinstance(target, bool) or not isinstance(target, (int, float, np.floating)) \
            or not 0 < float(target) <= 1:
        raise ValueError(f"recall_target must be a number in (0, 1], got {target!r}")
    return float(target)


@dataclasses.dataclass(frozen=True)
class ProbeLaw:
    """A measured probe law for one grid (see the module docstring for the JSON form).

    Args:
        grid: SHA-256 of the grid the law was measured on.
        n_cells: cells in that grid.
        rows: table rows the law stands for (recalibration is due at
            ``REGROW_FACTOR`` times this).
        queries: held-out rows measured (over all merged measurements).
        nprobe: the ladder of probe counts.
        recall: mean recall@k at each ladder point.
        stderr: standard error of each mean over the queries.
        k: the k of recall@k.
        prunable: at each ladder point, the share of a query's cells after
            its nearest that the distance bound lets it skip, once its nearest
            cell has given it a k-th distance (empty: not measured).
    """

    grid: str
    n_cells: int
    rows: int
    queries: int
    nprobe: Tuple[int, ...]
    recall: Tuple[float, ...]
    stderr: Tuple[float, ...]
    k: int = LAW_K
    prunable: Tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (len(self.nprobe) == len(self.recall) == len(self.stderr)) or not self.nprobe:
            raise ValueError(f"ProbeLaw: ladder, recall and stderr differ in length "
                             f"({len(self.nprobe)}, {len(self.recall)}, {len(self.stderr)})")

    def nprobe_for(self, target: float) -> int:
        """The fewest cells whose measured recall, less its margins, reaches ``target``.

        A target of 1.0 probes every cell (exact search).
        """
        target = check_target(target)
        if target >= 1.0:
            return self.n_cells
        for p, r, se in zip(self.nprobe, self.recall, self.stderr):
            if r - LAW_Z * se - SEARCH_LOSS >= target:
                return int(p)
        return self.n_cells

    def prunable_at(self, nprobe: int) -> float:
        """The measured share of skippable cells at the ladder point at or under ``nprobe``."""
        at = int(np.searchsorted(self.nprobe, nprobe, side="right")) - 1
        return float(self.prunable[at]) if self.prunable and at >= 0 else 0.0

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": LAW_FORMAT, "grid": self.grid, "n_cells": self.n_cells, "k": self.k,
            "rows": self.rows, "queries": self.queries, "nprobe": list(self.nprobe),
            "recall": [round(float(r), 5) for r in self.recall],
            "stderr": [round(float(s), 5) for s in self.stderr],
            "prunable": [round(float(s), 3) for s in self.prunable],
            "targets": {f"{t:g}": self.nprobe_for(t) for t in TARGETS},
        }

    @classmethod
    def from_json(cls, doc: Optional[Dict[str, Any]]) -> Optional["ProbeLaw"]:
        """The law in a ``probe_law`` property; None when absent or of a newer format."""
        if not isinstance(doc, dict) or doc.get("format") != LAW_FORMAT:
            return None
        return cls(grid=doc["grid"], n_cells=int(doc["n_cells"]), rows=int(doc["rows"]),
                   queries=int(doc["queries"]), nprobe=tuple(int(p) for p in doc["nprobe"]),
                   recall=tuple(float(r) for r in doc["recall"]),
                   stderr=tuple(float(s) for s in doc["stderr"]), k=int(doc.get("k", LAW_K)),
                   prunable=tuple(float(s) for s in doc.get("prunable", ())))


def adaptive(law: Optional[ProbeLaw], grid: str, nprobe: int) -> bool:
    """Whether queries probing ``nprobe`` cells should probe adaptively.

    Adaptive probing costs a second pass over the superfiles; it is worth it
    where the law measured that bounds skip at least ``ADAPTIVE_MIN_SHARE``
    of the cells (well-separated data). It never lowers recall.
    """
    return (law is not None and law.grid == grid and nprobe > 1
            and law.prunable_at(nprobe) >= ADAPTIVE_MIN_SHARE)


def nprobe_for_target(law: Optional[ProbeLaw], grid: str, n_cells: int,
                      target: Optional[float]) -> int:
    """Cells to probe for ``target`` (default 0.95): the law's answer, else the fallback.

    A law measured on another grid does not apply. Without a law a target
    other than the default cannot be honoured by a formula; the fallback then
    probes every cell for a target of 1.0, and otherwise the formula's count.
    """
    target = DEFAULT_RECALL_TARGET if target is None else check_target(target)
    if law is not None and law.grid == grid and law.n_cells == n_cells:
        return law.nprobe_for(target)
    return n_cells if target >= 1.0 else fallback_nprobe(n_cells)


def due(law: Optional[ProbeLaw], grid: str, rows_after: int) -> bool:
    """Whether a commit leaving the table at ``rows_after`` rows should recalibrate."""
    if law is None or law.grid != grid:
        return True
    return rows_after >= REGROW_FACTOR * max(law.rows, 1)


def measure(vectors: np.ndarray, centroids: np.ndarray, metric: str, grid: str, *,
            rows: Optional[int] = None, population: Optional[int] = None,
            queries: int = CALIBRATION_QUERIES,
            sample_rows: int = CALIBRATION_SAMPLE_ROWS, k: int = LAW_K,
            seed: int = SEED) -> Optional[ProbeLaw]:
    """Measures the probe law of ``vectors`` (rows of the table) on ``centroids``.

    Queries are rows held out of a uniform sample of ``sample_rows`` rows;
    their true neighbours are found among the other sampled rows. In a sample
    holding a share ``f`` of the rows, a query's nearest ``k * f`` sampled rows
    stand for its nearest ``k`` in the table (they are a random subset of about
    that many), so the law measures recall@k at the table's density at a
    fraction of a full brute-force pass.

    Args:
        vectors: ``[n, dim]`` rows as written (not yet prepared for the metric).
        centroids: the grid, as stored.
        grid: the grid's SHA-256, recorded in the law.
        rows: the table rows the law stands for (default ``population``).
        population: how many rows ``vectors`` were sampled from, when they
            are a sample (default ``len(vectors)``).
        queries: rows held out as queries.
        sample_rows: rows searched by brute force for the true neighbours.

    Returns:
        The law, or None when there are too few rows to hold any out.
    """
    x = prepare(vectors, metric)
    if len(x) < 2 or len(centroids) == 0:
        return None
    n = max(int(population or 0), len(x))
    rng = np.random.default_rng(seed)
    # A sample small enough that a query's stand-ins for its top k are at most
    # SAMPLE_NEIGHBOURS rows (found by a few argmin passes, not a sort), but
    # never under MIN_SAMPLE_ROWS rows.
    size = min(len(x), sample_rows,
               max(MIN_SAMPLE_ROWS, int(n * SAMPLE_NEIGHBOURS / k)))
    if len(x) > size:
        x = x[np.sort(rng.choice(len(x), size, replace=False))]
    n_q = min(queries, len(x) - 1)
    k_sample = max(1, min(len(x) - 1, int(round(k * len(x) / n))))
    held = rng.choice(len(x), n_q, replace=False)
    # The true neighbours of each held-out row among the others: ask for one
    # more and drop the row itself (or, if exact duplicates hide it, the last).
    found = nearest(x[held], x, metric, k_sample + 1, chunk=64)
    truth = np.empty((n_q, k_sample), dtype=np.int64)
    for j, row in enumerate(found):
        own = np.nonzero(row == held[j])[0]
        truth[j] = np.delete(row, own[0]) if len(own) else row[:k_sample]
    cell_of = nearest(x[truth.ravel()], centroids, metric, 1)[:, 0].reshape(n_q, k_sample)
    # rank_of[q, c]: where cell c stands in query q's order of cells.
    order = np.argsort(distances(x[held], centroids, metric), axis=1, kind="stable")
    rank_of = np.empty_like(order)
    np.put_along_axis(rank_of, order, np.arange(order.shape[1])[None, :], axis=1)
    ranks = np.take_along_axis(rank_of, cell_of, 1)           # [n_q, k_sample]
    steps = ladder(len(centroids))
    per_query = (ranks[:, :, None] < np.asarray(steps)[None, None, :]).mean(axis=1)
    recall = per_query.mean(axis=0)
    stderr = per_query.std(axis=0) / math.sqrt(n_q)
    few = slice(0, PRUNABLE_QUERIES)   # (a heuristic's input: fewer queries do)
    prunable = () if metric == "dot" else _prunable(x, held[few], order[few], centroids, metric,
                                                    k_sample, steps, recall)
    return ProbeLaw(grid=grid, n_cells=int(len(centroids)), rows=int(rows or n), queries=n_q,
                    nprobe=steps, recall=tuple(float(r) for r in recall),
                    stderr=tuple(float(s) for s in stderr), k=k, prunable=prunable)


def _prunable(x, held, order, centroids, metric, k_sample, steps, recall) -> Tuple[float, ...]:
    """Per ladder point, the share of cells after the nearest that bounds would skip.

    Simulates the adaptive search on the sample: a query scores its nearest
    cell, takes the ``k_sample``-th distance found there (at the sample's
    density that stands for the table's k-th), and skips each further cell
    whose bisector bound is not below it.
    """
    cell_of = nearest(x, centroids, metric, 1)[:, 0]
    members = np.argsort(cell_of, kind="stable")
    starts = np.searchsorted(cell_of[members], np.arange(len(centroids) + 1))
    kth = np.full(len(held), np.inf, dtype=np.float32)
    for j, row in enumerate(held):
        c1 = order[j, 0]
        mine = members[starts[c1]:starts[c1 + 1]]
        mine = mine[mine != row]
        if len(mine) >= k_sample:
            d = distances(x[row][None, :], x[mine], metric)[0]
            kth[j] = np.partition(d, k_sample - 1)[k_sample - 1]
    # Bounds up to where the measured recall is all but complete (or 32 cells).
    reach = next((p for p, r in zip(steps, recall) if r >= 0.999), steps[-1])
    reach = min(len(centroids), max(reach, 2 * LADDER_DENSE))
    bounds = bisector_bounds(x[held], centroids, order[:, :reach], metric)
    skip = bounds[:, 1:] >= kth[:, None]
    out = []
    for p in steps:
        p = min(p, reach)
        out.append(float(skip[:, :p - 1].mean()) if p > 1 else 0.0)
    return tuple(out)


def merge(old: Optional[ProbeLaw], new: ProbeLaw, old_rows: int, new_rows: int) -> ProbeLaw:
    """A law for ``old_rows`` rows measured by ``old`` plus ``new_rows`` measured by ``new``.

    The curves are averaged with the rows as weights (a query lands in either
    part in proportion to its rows). Without an old law of the same grid the
    new one stands alone, for all the rows.
    """
    rows = int(old_rows + new_rows)
    if old is None or old.grid != new.grid or old.nprobe != new.nprobe or old_rows <= 0:
        return dataclasses.replace(new, rows=rows)
    w_old = old_rows / (old_rows + new_rows)
    w_new = 1.0 - w_old
    recall = tuple(w_old * a + w_new * b for a, b in zip(old.recall, new.recall))
    stderr = tuple(math.hypot(w_old * a, w_new * b) for a, b in zip(old.stderr, new.stderr))
    prunable = tuple(w_old * a + w_new * b for a, b in zip(old.prunable, new.prunable)) \
        if len(old.prunable) == len(new.prunable) else ()
    return dataclasses.replace(new, rows=rows, queries=old.queries + new.queries,
                               prunable=prunable,
                               recall=recall, stderr=stderr)


def sample_rows(sizes: Sequence[int], cap: int, seed: int = SEED) -> Sequence[np.ndarray]:
    """Per part of ``sizes`` rows, the row numbers of a uniform sample of at most ``cap`` in all."""
    total = int(sum(sizes))
    if total <= cap:
        return [np.arange(s) for s in sizes]
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(total, cap, replace=False))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [picked[(picked >= a) & (picked < b)] - a for a, b in zip(bounds[:-1], bounds[1:])]


class CommitLaw:
    """The ``probe_law`` one commit stamps, on whichever base it lands on.

    A commit may be rebuilt against newer bases (a lost race, a keyed
    mutation re-resolved): whether a law is due and what it merges with
    depend on the base, the measurement of the commit's own rows does not.
    So the rows are measured once per grid, on the first base that needs it,
    and :meth:`for_base` merges that measurement with each base's law, as a
    commit on that base alone would.

    Args:
        metric: the table's metric.
        entries: the superfile entries the commit adds.
        read_vectors: ``(entry, rows) -> [len(rows), dim]`` vectors of those
            rows of a new superfile (the I/O is the caller's).
        in_memory: ``(rows) -> vectors`` of the commit's rows in the writer's
            memory (row numbers over all the entries' rows, in any order),
            when it still holds them: then nothing is read back.
    """

    def __init__(self, metric: str, entries: Sequence[Dict[str, Any]],
                 read_vectors: Callable[[Dict[str, Any], np.ndarray], np.ndarray],
                 in_memory: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> None:
        self._metric = metric
        self._entries = tuple(entries)
        self._read_vectors = read_vectors
        self._in_memory = in_memory
        self._measured: Dict[str, Optional[ProbeLaw]] = {}

    def for_base(self, current: Optional[Dict[str, Any]], grid: str, base_rows: int,
                 centroids: Callable[[], np.ndarray]) -> Optional[Dict[str, Any]]:
        """The law to stamp on a base, or None if none is due there.

        Args:
            current: the base's ``probe_law`` property.
            grid: SHA-256 of the grid at the base (entries of another grid
                are ignored).
            base_rows: rows in the base.
            centroids: loads that grid (called only to measure).
        """
        law = ProbeLaw.from_json(current)
        mine = [e for e in self._entries if e.get("grid") == grid and e.get("rows")]
        added = int(sum(e["rows"] for e in mine))
        if not added or not due(law, grid, base_rows + added):
            return None
        if grid not in self._measured:
            self._measured[grid] = self._measure(mine, added, grid, centroids)
        new = self._measured[grid]
        if new is None:
            return None
        same = law is not None and law.grid == grid
        return merge(law if same else None, new, base_rows if same else 0, added).to_json()

    def _measure(self, mine: Sequence[Dict[str, Any]], added: int, grid: str,
                 centroids: Callable[[], np.ndarray]) -> Optional[ProbeLaw]:
        if self._in_memory is not None and len(mine) == len(self._entries):
            vectors = self._in_memory(sample_rows([added], CALIBRATION_SAMPLE_ROWS)[0])
        else:
            picks = sample_rows([int(e["rows"]) for e in mine], CALIBRATION_SAMPLE_ROWS)
            vectors = np.concatenate([self._read_vectors(e, rows)
                                      for e, rows in zip(mine, picks) if len(rows)])
        return measure(vectors, centroids(), self._metric, grid, population=added)


def law_for_commit(current: Optional[Dict[str, Any]], grid: str, metric: str, base_rows: int,
                   entries: Sequence[Dict[str, Any]],
                   read_vectors: Callable[[Dict[str, Any], np.ndarray], np.ndarray],
                   centroids: Callable[[], np.ndarray],
                   in_memory: Optional[Callable[[np.ndarray], np.ndarray]] = None
                   ) -> Optional[Dict[str, Any]]:
    """The ``probe_law`` a commit adding ``entries`` on one base should stamp, or None.

    One-shot form of :class:`CommitLaw` (``centroids`` loads the grid).
    """
    return CommitLaw(metric, entries, read_vectors, in_memory).for_base(
        current, grid, base_rows, centroids)
