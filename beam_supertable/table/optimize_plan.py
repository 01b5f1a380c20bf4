"""``optimize``'s plan: which superfiles to rewrite, grouped by cell, and which
cells to split (read-only: it reads the manifest and cell directories)."""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from beam_supertable.format import deletes as dv
from beam_supertable.format.reader import SuperfileReader
from beam_supertable.format.writer import TARGET_SUPERFILE_BYTES
from beam_supertable.table.handle import TableHandle
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector.metric import nearest, prepare

DEFAULT_TARGET_FILE_BYTES = TARGET_SUPERFILE_BYTES   # 64 MiB
SMALL_FILE_SHARE = 0.5        # a superfile under this share of the target is "small"
MIN_CELL_ROWS = 256           # the default cell cap never goes below this
CELL_ROWS_PER_SQRT = 2        # default cap: 2 * sqrt(live rows), what a fresh grid would hold x2
SPLIT_FILL = 0.5              # sub-cells are sized to this share of the cap...
SPLIT_MAX_FILL = 0.75         # ...and re-split while one holds more than this share
SPLIT_ROUNDS = 4
SPLIT_SAMPLE_ROWS = 65_536    # k-means of a split runs on at most this many of the cell's rows
REPLAN_ATTEMPTS = 3
OPERATION = "optimize"


def default_max_cell_rows(live_rows: int) -> int:
    """The default cap on rows per cell: ``max(MIN_CELL_ROWS, 2·sqrt(live rows))``.

    A grid trained on ``n`` rows has about ``sqrt(n)`` cells of ``sqrt(n)``
    rows (``grid.default_n_cells``); a cell holding twice that for the
    table's current size is split, into sub-cells of about ``sqrt(n)`` rows,
    so a table grown by appends ends with the cells a fresh grid would give.
    Below ``MIN_CELL_ROWS`` a split saves less than it costs.
    """
    return max(MIN_CELL_ROWS, int(math.ceil(CELL_ROWS_PER_SQRT * math.sqrt(max(live_rows, 0)))))


@dataclasses.dataclass(frozen=True)
class Source:
    """A superfile the plan rewrites, as the plan read it."""

    entry: Dict[str, Any] = dataclasses.field(compare=False)
    deletes: Tuple[str, ...]       # its deletion vectors at the plan's version
    deleted: int                   # rows they hide

    @property
    def id(self) -> str:
        return self.entry["id"]

    @property
    def path(self) -> str:
        return self.entry["path"]


@dataclasses.dataclass(frozen=True)
class OptimizeGroup(collections.abc.Sequence):
    """One unit of rewriting: the superfiles holding a range of cells.

    A sequence of the superfile paths it reads; ``cells`` is the half-open
    range of cell ids (of the grids the superfiles were written against) whose
    rows it rewrites, None for a table without a vector column (then it
    rewrites its superfiles whole).
    """

    number: int                    # its place in ``plan.groups``
    paths: Tuple[str, ...]
    cells: Optional[Tuple[int, int]]
    rows: int
    bytes: int

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i):
        return self.paths[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def to_dict(self) -> Dict[str, Any]:
        return {"number": self.number, "paths": list(self.paths),
                "cells": None if self.cells is None else list(self.cells),
                "rows": self.rows, "bytes": self.bytes}


@dataclasses.dataclass(frozen=True)
class OptimizePlan:
    """What one ``optimize`` rewrites, read from one version.

    Attributes:
        version: the version planned on.
        groups: the rewrite units, each a sequence of superfile paths (per cell range).
        superfiles_to_rewrite: superfiles the commit removes.
        rows_to_rewrite: their live rows (written again, same ``_id`` s).
        deleted_rows_to_reclaim: their rows hidden by deletion vectors (dropped).
        bytes_to_rewrite: their size on storage.
        cells_to_split: cells over ``max_cell_rows`` that are split.
        estimated_superfiles_after: superfiles the table holds afterwards (about).
        max_cell_rows: the cell cap used.
        target_file_bytes: the target superfile size used.
        new_cells: cells the grid gains by the splits.
    """

    version: int
    groups: Tuple[OptimizeGroup, ...]
    superfiles_to_rewrite: int
    rows_to_rewrite: int
    deleted_rows_to_reclaim: int
    bytes_to_rewrite: int
    cells_to_split: int
    estimated_superfiles_after: int
    max_cell_rows: Optional[int]
    target_file_bytes: int
    new_cells: int = 0
    sources: Tuple[Source, ...] = dataclasses.field(default=(), repr=False)
    grid: Optional[Dict[str, Any]] = dataclasses.field(default=None, repr=False)
    new_grid: Optional[Dict[str, Any]] = dataclasses.field(default=None, repr=False)
    centroids: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def empty(self) -> bool:
        """Nothing to rewrite."""
        return not self.groups

    @property
    def token(self) -> str:
        """The commit's idempotency token: a rerun of this plan commits once."""
        body = {"version": self.version, "sources": sorted(s.id for s in self.sources),
                "grid": (self.new_grid or {}).get("sha256"),
                "target": self.target_file_bytes}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return f"optimize/{digest[:32]}"

    def to_dict(self) -> Dict[str, Any]:
        """The plan as JSON data (for ``--json`` and logs)."""
        return {
            "version": self.version,
            "groups": [g.to_dict() for g in self.groups],
            "superfiles_to_rewrite": self.superfiles_to_rewrite,
            "rows_to_rewrite": self.rows_to_rewrite,
            "deleted_rows_to_reclaim": self.deleted_rows_to_reclaim,
            "bytes_to_rewrite": self.bytes_to_rewrite,
            "cells_to_split": self.cells_to_split,
            "new_cells": self.new_cells,
            "estimated_superfiles_after": self.estimated_superfiles_after,
            "max_cell_rows": self.max_cell_rows,
            "target_file_bytes": self.target_file_bytes,
        }


# -- planning ------------------------------------------------------------------


def _check_positive(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"optimize: {name} must be a positive int{' or None' if allow_none else ''}, "
                         f"got {value!r}")


def _reader(table: TableHandle, entry: dict) -> SuperfileReader:
    return table._reader(entry)   # opened once per handle (kept in its cache)


def _cell_dir(table: TableHandle, entry: dict) -> List[Tuple[int, int, int]]:
    """``[(cell, first row, rows)]`` of a superfile, from its footer."""
    return [(int(c), int(s), int(n)) for c, s, n, *_ in
            _reader(table, entry).header["vector"]["cells"]]


def _deleted(table: TableHandle, paths: Sequence[str]) -> np.ndarray:
    if not paths:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(
        [dv.decode(table.store.get(p), f"{table.uri}/{p}") for p in paths]))


def plan_optimize(table: TableHandle, *, target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
                  max_cell_rows: Optional[int] = None,
                  max_rewrite_bytes: Optional[int] = None) -> OptimizePlan:
    """Plans an optimize of ``table``'s version (writes nothing).

    Args:
        target_file_bytes: the size rewritten superfiles aim at.
        max_cell_rows: split cells holding more live rows (default
            ``default_max_cell_rows(live rows)``).
        max_rewrite_bytes: rewrite at most about this many bytes of superfiles
            (the most useful first: splits, then deletes, then small files);
            at least one unit of work is planned whatever its size.

    Returns:
        The plan; ``plan.empty`` when there is nothing to do.
    """
    _check_positive("target_file_bytes", target_file_bytes, allow_none=False)
    _check_positive("max_cell_rows", max_cell_rows)
    _check_positive("max_rewrite_bytes", max_rewrite_bytes)
    snap = table.snapshot
    entries = snap.entries()
    vp = snap.properties.get("vector")
    stamp = snap.properties.get("grid") if vp else None
    deleted = {e["id"]: _deleted(table, snap.deletes.get(e["id"], ())) for e in entries
               if snap.deletes.get(e["id"])}
    live_rows = sum(e["rows"] for e in entries) - sum(len(d) for d in deleted.values())
    cap = (max_cell_rows or default_max_cell_rows(live_rows)) if stamp else None

    # Units of work in priority order; a unit is rewritten whole or not at all.
    units: List[Tuple[str, List[dict], Any]] = []
    cell_dirs: Dict[str, List[Tuple[int, int, int]]] = {}
    if stamp is not None:
        sizes = grid_mod.lineage(stamp)
        n_now = int(stamp["n_cells"])
        per_cell = np.zeros(n_now, np.int64)
        holders: Dict[int, List[dict]] = {}
        for e in entries:
            d = cell_dirs[e["id"]] = _entry_cells(table, e)
            gone = deleted.get(e["id"])
            for cell, start, count in d:
                live = count if gone is None else \
                    count - int(np.count_nonzero((gone >= start) & (gone < start + count)))
                if cell < n_now:
                    per_cell[cell] += live
                holders.setdefault(cell, []).append(e)
        metric = vp["metric"]
        n_left = grid_mod.MAX_CELLS - n_now
        for cell in np.argsort(-per_cell, kind="stable"):
            if per_cell[cell] <= cap or n_left <= 0:
                break
            # Split now: a cell k-means cannot divide (rows of one vector)
            # must not make every later optimize rewrite its superfiles.
            subs = _split_cell(_cell_vectors(table, int(cell), holders[int(cell)], cell_dirs,
                                             deleted), cap, metric)
            if len(subs) >= 2 and len(subs) - 1 <= n_left:
                units.append(("split", holders[int(cell)], (int(cell), subs)))
                n_left -= len(subs) - 1
        regrid = []
        for e in entries:
            n_g = sizes.get(e.get("grid"), n_now)
            if n_g < n_now:
                split_since = set(grid_mod.ancestors(stamp, n_g)[n_g:].tolist())
                if split_since & set(e.get("cells", ())):
                    regrid.append(e)
    else:
        regrid = []
    for e in sorted((e for e in entries if e["id"] in deleted),
                    key=lambda e: -len(deleted[e["id"]]) / max(e["rows"], 1)):
        units.append(("deletes", [e], None))
    units.extend(("regrid", [e], None) for e in regrid)
    small_limit = SMALL_FILE_SHARE * target_file_bytes
    small = sorted((e for e in entries if e["bytes"] < small_limit), key=lambda e: e["bytes"])
    units.extend(("small", [e], None) for e in small)

    chosen: Dict[str, dict] = {}
    splits: List[Tuple[int, np.ndarray]] = []
    budget = max_rewrite_bytes
    spent = 0
    for kind, members, cell in units:
        fresh = [e for e in members if e["id"] not in chosen]
        cost = sum(e["bytes"] for e in fresh)
        if budget is not None and chosen and spent + cost > budget:
            continue
        if kind == "small" and not chosen and len(small) < 2:
            continue   # one small superfile alone: nothing to merge it with
        for e in fresh:
            chosen[e["id"]] = e
        spent += cost
        if kind == "split":
            splits.append(cell)
    if len(chosen) == 1 and not splits and not any(i in deleted for i in chosen):
        # Only a lone small or regrid superfile: rewriting it changes nothing
        # but its grid stamp; worth it only for a regrid.
        only = next(iter(chosen.values()))
        if only not in regrid:
            chosen = {}
    if not chosen:
        return OptimizePlan(snap.version, (), 0, 0, 0, 0, 0, len(entries), cap,
                            target_file_bytes, grid=stamp)

    sources = tuple(Source(e, tuple(snap.deletes.get(e["id"], ())),
                           len(deleted.get(e["id"], ()))) for e in chosen.values())
    new_grid, centroids, new_cells = None, None, 0
    if splits:
        new_grid, centroids, new_cells = _split(table, stamp, splits)
    groups = _groups(sources, cell_dirs, deleted, stamp, target_file_bytes)
    rows = sum(s.entry["rows"] - s.deleted for s in sources)
    out_files = sum(max(1, int(g.bytes // target_file_bytes)) for g in groups)
    return OptimizePlan(
        version=snap.version, groups=groups, superfiles_to_rewrite=len(sources),
        rows_to_rewrite=rows, deleted_rows_to_reclaim=sum(s.deleted for s in sources),
        bytes_to_rewrite=sum(s.entry["bytes"] for s in sources), cells_to_split=len(splits),
        estimated_superfiles_after=len(entries) - len(sources) + out_files,
        max_cell_rows=cap, target_file_bytes=target_file_bytes, new_cells=new_cells,
        sources=sources, grid=stamp, new_grid=new_grid, centroids=centroids)


def _entry_cells(table: TableHandle, entry: dict) -> List[Tuple[int, int, int]]:
    """``[(cell, first row, rows)]``: from the manifest entry when it carries
    ``cell_rows``, else from the superfile's footer."""
    if "cell_rows" in entry:
        counts = entry["cell_rows"]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if counts else []
        return [(int(c), int(s), int(n)) for c, s, n in zip(entry["cells"], starts, counts)]
    return _cell_dir(table, entry)


def _groups(sources: Sequence[Source], cell_dirs, deleted, stamp,
            target: int) -> Tuple[OptimizeGroup, ...]:
    """Cuts the sources' cells into ranges of about ``target`` live bytes."""
    if stamp is None:
        # No cells: runs of whole superfiles, about ``target`` bytes each.
        out, run, size, rows = [], [], 0, 0
        for s in sources:
            share = (s.entry["rows"] - s.deleted) / max(s.entry["rows"], 1)
            run.append(s.path)
            size += int(s.entry["bytes"] * share)
            rows += s.entry["rows"] - s.deleted
            if size >= target:
                out.append(OptimizeGroup(len(out), tuple(run), None, rows, size))
                run, size, rows = [], 0, 0
        if run:
            out.append(OptimizeGroup(len(out), tuple(run), None, rows, size))
        return tuple(out)
    n = max([int(stamp["n_cells"])] + [c + 1 for s in sources for c, _, _ in cell_dirs[s.id]])
    cell_bytes = np.zeros(n, np.float64)
    cell_rows = np.zeros(n, np.int64)
    holders: Dict[int, List[str]] = {}
    for s in sources:
        per_row = s.entry["bytes"] / max(s.entry["rows"], 1)
        gone = deleted.get(s.id)
        for cell, start, count in cell_dirs[s.id]:
            live = count if gone is None else \
                count - int(np.count_nonzero((gone >= start) & (gone < start + count)))
            cell_bytes[cell] += live * per_row
            cell_rows[cell] += live
            holders.setdefault(cell, []).append(s.path)
    out, lo, size, rows = [], None, 0.0, 0
    for cell in range(n):
        if cell not in holders:
            continue
        lo = cell if lo is None else lo
        size += cell_bytes[cell]
        rows += int(cell_rows[cell])
        if size >= target:
            out.append((lo, cell + 1, rows, size))
            lo, size, rows = None, 0.0, 0
    if lo is not None:
        out.append((lo, n, rows, size))
    groups = []
    for lo, hi, rows, size in out:
        paths = sorted({p for c in range(lo, hi) for p in holders.get(c, ())})
        groups.append(OptimizeGroup(len(groups), tuple(paths), (lo, hi), rows, int(size)))
    return tuple(groups)


def _cell_vectors(table: TableHandle, cell: int, holders: Sequence[dict], cell_dirs,
                  deleted) -> np.ndarray:
    """The live rows of ``cell`` in ``holders``: their SQ8 codes, decoded (prepared)."""
    parts = []
    for e in holders:
        for c, start, count in cell_dirs[e["id"]]:
            if c != cell:
                continue
            x = _reader(table, e).vector_index().vectors(start, start + count)
            gone = deleted.get(e["id"])
            if gone is not None and len(gone):
                x = x[~np.isin(np.arange(start, start + count), gone)]
            parts.append(x)
    dim = table.snapshot.properties["vector"]["dim"]
    return np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)


def _split(table: TableHandle, stamp: dict, splits: Sequence[Tuple[int, np.ndarray]]
           ) -> Tuple[dict, np.ndarray, int]:
    """The grid after the splits ``[(cell, sub-centroids)]``: the first
    sub-centroid takes the cell's id, the others are appended. Returns (the
    new grid's stamp without a path, its centroids, cells added)."""
    centroids = table.grid().copy()
    n0 = len(centroids)
    parents = list(stamp.get("parents", ()))
    added: List[np.ndarray] = []
    for cell, subs in sorted(splits, key=lambda s: s[0]):
        centroids[cell] = subs[0]
        added.append(subs[1:])
        parents.extend([cell] * (len(subs) - 1))
    centroids = np.concatenate([centroids] + added).astype(np.float32)
    data = grid_mod.to_bytes(centroids)
    lineage = list(stamp.get("lineage", ())) + [
        {"sha256": stamp["sha256"], "n_cells": int(stamp["n_cells"])}]
    new = {"n_cells": int(len(centroids)), "sha256": grid_mod.fingerprint(data),
           "base_cells": int(stamp.get("base_cells", n0)), "parents": [int(p) for p in parents],
           "lineage": lineage}
    return new, centroids, len(centroids) - n0


def _split_cell(x: np.ndarray, cap: int, metric: str) -> np.ndarray:
    """Sub-centroids for one cell's rows (fixed seed: the same rows, the same split)."""
    pending, done = [x], []
    for _ in range(SPLIT_ROUNDS):
        nxt = []
        for part in pending:
            if len(part) <= cap * SPLIT_MAX_FILL or len(part) < 2:
                done.append(part.mean(axis=0) if len(part) else None)
                continue
            k = min(len(part), max(2, math.ceil(len(part) / (cap * SPLIT_FILL))))
            rng = np.random.default_rng(grid_mod.SEED)
            sample = part[rng.choice(len(part), SPLIT_SAMPLE_ROWS, replace=False)] \
                if len(part) > SPLIT_SAMPLE_ROWS else part
            # One thread: the cells are small, and OpenMP's threads spinning on
            # a busy machine cost ~30x the work itself (measured).
            from sklearn.cluster import KMeans  # (slow import: on use)
            from threadpoolctl import threadpool_limits

            with threadpool_limits(1):
                km = KMeans(n_clusters=k, n_init=1, max_iter=grid_mod.KMEANS_ITERATIONS,
                            random_state=grid_mod.SEED).fit(sample)
            cents = km.cluster_centers_.astype(np.float32)
            labels = nearest(part, cents, metric, 1)[:, 0]
            nxt.extend(part[labels == j] for j in range(k) if (labels == j).any())
        pending = nxt
        if not pending:
            break
    done.extend(p.mean(axis=0) for p in pending)
    subs = np.array([c for c in done if c is not None], dtype=np.float32)
    if len(subs):
        subs = subs[np.sort(np.unique(subs, axis=0, return_index=True)[1])]
    return prepare(subs, metric) if metric == "cosine" else subs
