"""The table-wide grid of cells: k-means over a sample, stored as ``.npy``."""

from __future__ import annotations

import hashlib
import io
import math
import uuid
from typing import Optional, Tuple

import numpy as np

from beam_supertable.vector.metric import nearest, prepare

SEED = 0
CELLS_PER_SQRT_ROW = 2.5     # large tables: 2.5 sqrt(rows) cells ...
MIN_ROWS_PER_CELL = 128      # ... while a cell keeps 128 rows; never fewer than sqrt(rows)
SAMPLE_PER_CELL = 16         # k-means trains on 16 rows a cell ...
MIN_SAMPLE = 16_384          # ... and on at least this many
INIT_SAMPLE_PER_CELL = 4     # k-means++ seeds from 4 rows a cell (its loop is sequential) ...
SMALL_TRAINING = 4_000_000   # ... unless sample rows x cells is under this: then from all
MAX_SAMPLE = 100_000
MAX_CELLS = 16_384
KMEANS_ITERATIONS = 15
KMEANS_ITERATIONS_SMALL = 25
GRID_PREFIX = "_supertable/grid"


def default_n_cells(rows: int) -> int:
    """Cells for a table of ``rows``: about 2.5 sqrt(rows) once cells hold 128 rows.

    A 200,000-row table gets 1,118 cells of ~180 rows; 10,000 rows get 100.
    More, smaller cells mean fewer rows scanned per query for a given recall
    (cells follow the data's clusters more closely), at the price of more
    cells to rank and touch per query; the per-cell cost of the search loop
    sets the floor of 128 rows.
    """
    root = math.sqrt(max(rows, 1))
    n = max(root, min(CELLS_PER_SQRT_ROW * root, rows / MIN_ROWS_PER_CELL))
    return int(min(MAX_CELLS, max(1, round(n))))


def train(vectors: np.ndarray, n_cells: int, metric: str) -> np.ndarray:
    """Centroids from k-means on a sample (fixed seed: the same input, the same grid)."""
    x = prepare(vectors, metric)
    n_cells = max(1, min(n_cells, len(x)))
    rng = np.random.default_rng(SEED)
    size = min(len(x), max(n_cells * SAMPLE_PER_CELL, MIN_SAMPLE), MAX_SAMPLE)
    sample = x[rng.choice(len(x), size, replace=False)] if size < len(x) else x
    # k-means++ (one local trial per centre, compiled) on a smaller sample: its
    # loop over centres is sequential and dominated training; Lloyd's iterations on the
    # full sample then refine the seeds.
    # Small trainings (a few seconds' worth at most) seed from the whole
    # sample and iterate longer: a better grid probes fewer cells.
    small = len(sample) * n_cells <= SMALL_TRAINING
    m = len(sample) if small else max(n_cells, min(len(sample), n_cells * INIT_SAMPLE_PER_CELL))
    seeds = sample[np.sort(rng.choice(len(sample), m, replace=False))] if m < len(sample) else sample
    from sklearn.cluster import KMeans  # (slow import: on use)

    from beam_supertable.vector import kernels   # (numba: imported on first use)

    init = seeds[kernels.kmeans_plusplus(seeds, n_cells, SEED)]
    km = KMeans(n_clusters=n_cells, init=init, n_init=1, random_state=SEED,
                max_iter=KMEANS_ITERATIONS_SMALL if small else KMEANS_ITERATIONS).fit(sample)
    centroids = km.cluster_centers_.astype(np.float32)
    return prepare(centroids, metric) if metric == "cosine" else centroids


def assign(vectors: np.ndarray, centroids: np.ndarray, metric: str,
           replica_factor: float = 0.0) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Each row's nearest cell, and (with ``replica_factor``) a second cell or -1.

    A row is replicated into its second-nearest cell when that cell's distance
    is within ``1 + replica_factor`` of the nearest one's, for at most a
    ``replica_factor`` share of the rows (the closest calls first).
    """
    x = prepare(vectors, metric)
    if replica_factor <= 0 or len(centroids) < 2:
        return nearest(x, centroids, metric, 1)[:, 0], None
    top = nearest(x, centroids, metric, 2)
    d1 = _pair(x, centroids, top[:, 0], metric)
    d2 = _pair(x, centroids, top[:, 1], metric)
    ratio = (d2 - d1) / np.maximum(np.abs(d1), 1e-12)
    second = np.full(len(x), -1, dtype=np.int64)
    budget = int(len(x) * replica_factor)
    close = np.where(ratio <= replica_factor)[0]
    close = close[np.argsort(ratio[close], kind="stable")][:budget]
    second[close] = top[close, 1]
    return top[:, 0], second


def _pair(x, centroids, idx, metric):
    c = centroids[idx]
    if metric == "l2":
        return np.einsum("ij,ij->i", x - c, x - c)
    dots = np.einsum("ij,ij->i", x, c)
    return 1 - dots if metric == "cosine" else -dots


def to_bytes(centroids: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(centroids, dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


def from_bytes(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def ancestors(stamp: dict, n_cells: int) -> np.ndarray:
    """For each cell of the grid ``stamp``, the cell it descends from in the
    older grid of that lineage with ``n_cells`` cells.

    A split keeps the parent's id for its first sub-cell and appends the
    others; ``stamp["parents"][i]`` is the parent of cell ``base_cells + i``
    (``base_cells``: the first grid's size). So ids never change meaning
    across grid versions except by splitting, and a cell of an older grid is
    the union of its descendants in a newer one.
    """
    n = int(stamp["n_cells"])
    out = np.arange(n, dtype=np.int64)
    base = int(stamp.get("base_cells", n))
    parents = np.asarray(stamp.get("parents", ()), dtype=np.int64)
    while True:
        newer = out >= n_cells
        if not newer.any():
            return out
        out[newer] = parents[out[newer] - base]


def lineage(stamp: dict) -> dict:
    """``{grid sha256: n_cells}`` of the grid ``stamp`` and every grid it grew from."""
    out = {g["sha256"]: int(g["n_cells"]) for g in stamp.get("lineage", ())}
    out[stamp["sha256"]] = int(stamp["n_cells"])
    return out


def grid_path() -> str:
    return f"{GRID_PREFIX}/{uuid.uuid4().hex}.npy"


def fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
