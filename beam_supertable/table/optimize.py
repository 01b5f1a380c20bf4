"""``optimize``: compact superfiles by cell, reclaim deleted rows, split big cells.

Three stages, so a distributed job can run the middle one in parallel
workers (``pipelines/optimize_supertable.py``)::

    plan = plan_optimize(table, ...)                 # reads the manifest (and cell codes)
    entries = [e for g in plan.groups for e in rewrite_group(table, plan, g)]
    version = commit_optimize(table, plan, entries)  # one commit

What is rewritten (``plan_optimize``):

- every superfile holding rows hidden by deletion vectors (they are dropped);
- every superfile holding a cell with more live rows than ``max_cell_rows``:
  the cell is split by k-means (fixed seed) on its rows into sub-cells of
  about half the cap. The grid grows: the first sub-cell keeps the cell's id,
  the others get new ids appended to the grid, and the new grid is stamped
  with its lineage (``base_cells``, ``parents``, and the hashes and sizes of
  the grids it grew from). Superfiles written against an older grid stay
  valid: a query probes, in them, the cells its probed cells descend from;
- superfiles of an older grid holding a cell that has been split since;
- small superfiles (under ``SMALL_FILE_SHARE`` of the target size), when
  there are two or more of them or anything else is rewritten.

The chosen superfiles' rows are grouped by cell: the cells are cut into
ranges of about ``target_file_bytes`` of live rows each, one group per
range, and each group is written as one superfile (more when one cell alone
is larger), rows ordered by cell. So only the last range can come out small,
and optimizing an optimized table finds nothing to do.

Every row keeps its ``_id`` and its values; the indexes (fine IVF, codes,
BM25 statistics, term filters, key statistics) are built afresh by the same
code that writes appends.

Concurrency (``commit_optimize``): the commit removes the rewritten
superfiles and adds the new ones. Appends landing meanwhile just rebase. A
delete or upsert that landed on a rewritten superfile after the plan read it
is carried over: its rows' ``_id`` s are found in the new superfiles and
deleted there by new deletion vectors, on every base the commit loop tries.
A concurrent optimize that removed one of the same superfiles, or stamped
another grid while this one splits cells, is a conflict: ``Supertable.
optimize`` plans again (at most ``REPLAN_ATTEMPTS`` times).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from beam_supertable.errors import CommitConflictError, CommitFailedError
from beam_supertable.format import deletes as dv
from beam_supertable.format.manifest import CommitRequest, Snapshot
from beam_supertable.format.schema import ID
from beam_supertable.vector.metric import vectors_of
from beam_supertable.format.writer import build_and_upload
from beam_supertable.table.handle import TableHandle
from beam_supertable.table.optimize_plan import (  # noqa: F401 - the plan and its tunables, re-exported
    CELL_ROWS_PER_SQRT,
    DEFAULT_TARGET_FILE_BYTES,
    MIN_CELL_ROWS,
    OPERATION,
    REPLAN_ATTEMPTS,
    SMALL_FILE_SHARE,
    SPLIT_FILL,
    SPLIT_MAX_FILL,
    SPLIT_ROUNDS,
    SPLIT_SAMPLE_ROWS,
    OptimizeGroup,
    OptimizePlan,
    Source,
    _deleted,
    _reader,
    default_max_cell_rows,
    plan_optimize,
)
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector.metric import nearest, prepare

__all__ = [
    "DEFAULT_TARGET_FILE_BYTES", "MIN_CELL_ROWS", "OptimizeGroup", "OptimizePlan",
    "commit_optimize", "default_max_cell_rows", "plan_optimize", "rewrite_group",
]

_LOG = logging.getLogger(__name__)


# -- rewriting -----------------------------------------------------------------
def rewrite_group(table: TableHandle, plan: OptimizePlan, group: OptimizeGroup) -> List[dict]:
    """Writes one group's live rows as new superfiles; returns their entries.

    A function of the plan and the group only (the handle gives the store and
    the table's layout; its version does not matter), so workers may run
    groups in parallel and a retried group writes the same rows again.
    Nothing is committed: unreferenced superfiles are orphans ``vacuum``
    reclaims.
    """
    by_path = {s.path: s for s in plan.sources}
    vp = table.snapshot.properties.get("vector") if plan.grid is not None else None
    pieces, ids_, cells = [], [], []
    user_names = [n for n in table.schema.names if n != ID]
    for path in group.paths:
        source = by_path[path]
        reader = _reader(table, source.entry)
        gone = _deleted(table, source.deletes)
        if group.cells is None:
            rows = np.arange(source.entry["rows"], dtype=np.int64)
            src_cells = None
        else:
            lo, hi = group.cells
            spans = [(c, s, n) for c, s, n, *_ in reader.header["vector"]["cells"] if lo <= c < hi]
            if not spans:
                continue
            rows = np.concatenate([np.arange(s, s + n, dtype=np.int64) for _, s, n in spans])
            src_cells = np.concatenate([np.full(n, c, np.int64) for c, _, n in spans])
        if len(gone):
            keep = ~np.isin(rows, gone)
            rows = rows[keep]
            src_cells = None if src_cells is None else src_cells[keep]
        if not len(rows):
            continue
        part = reader.take(rows)
        pieces.append(part.select(user_names))
        ids_.append(part.column(ID).to_numpy())
        if src_cells is not None:
            cells.append(_regrid_cells(plan, source, src_cells, part, vp,
                                       lambda: _centroids(table, plan)))
    if not pieces:
        return []
    user = pa.concat_tables(pieces)
    ids = np.concatenate(ids_)
    layout = dataclasses.replace(table.layout(), target_bytes=plan.target_file_bytes)
    if plan.grid is None:
        return _write_chunks(table, group, user, ids, None, None, None, layout)
    cell = np.concatenate(cells)
    replicas = None
    if layout.replica_factor > 0:
        x = vectors_of(user, vp["column"], vp["dim"])
        _, second = grid_mod.assign(x, _centroids(table, plan), vp["metric"], layout.replica_factor)
        if second is not None:
            replicas = np.where(second == cell, -1, second)
    # Rows by (cell, _id): the output is the same whatever order the sources came in.
    order = np.lexsort((ids, cell))
    take = pa.array(order)
    grid_id = (plan.new_grid or plan.grid)["sha256"]
    return _write_chunks(table, group, user.take(take), ids[order], cell[order],
                         None if replicas is None else replicas[order], grid_id, layout)


def _centroids(table: TableHandle, plan: OptimizePlan) -> np.ndarray:
    """The centroids of the grid the rewritten rows are written against."""
    if plan.centroids is not None:
        return plan.centroids
    held = table.snapshot.properties.get("grid") or {}
    if held.get("sha256") == plan.grid["sha256"]:
        return table.grid()
    return grid_mod.from_bytes(table.store.get(plan.grid["path"]))


def _regrid_cells(plan: OptimizePlan, source: Source, src_cells: np.ndarray, part: pa.Table,
                  vp: dict, centroids: Callable[[], np.ndarray]) -> np.ndarray:
    """The rows' cells in the grid the optimize commits: unchanged when the
    superfile was written on that grid, else each row's nearest centre of it.

    Nearest-centre assignment on the committed grid is the writer's rule, and
    what search relies on: the probe law measured for the new grid, and the
    distance bounds of adaptive probing, both assume it. (Sending rows only
    to the sub-cells of their old cell would leave rows of unsplit cells
    beside a nearer new centre, and queries probing by nearest centres would
    miss them.)
    """
    target = plan.new_grid or plan.grid
    if source.entry.get("grid") == target["sha256"]:
        return src_cells
    x = prepare(vectors_of(part, vp["column"], vp["dim"]), vp["metric"])
    return nearest(x, centroids(), vp["metric"], 1)[:, 0].astype(np.int64)


def _write_chunks(table, group, user, ids, cells, replicas, grid_id, layout) -> List[dict]:
    """One superfile, or ``floor(bytes / target)`` cut at cell boundaries when larger."""
    n = max(1, int(group.bytes // layout.target_bytes))
    bounds = np.linspace(0, user.num_rows, n + 1).astype(np.int64)
    if cells is not None and n > 1:
        starts = np.concatenate([[0], np.where(np.diff(cells) != 0)[0] + 1, [len(cells)]])
        cut = starts[np.searchsorted(starts, bounds[1:-1])]
        bounds = np.unique(np.concatenate([[0], cut, [user.num_rows]]))
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b <= a:
            continue
        out.append(build_and_upload(
            table.store, user.slice(a, b - a), layout,
            None if cells is None else cells[a:b],
            None if replicas is None else replicas[a:b], grid_id, ids=ids[a:b]))
    return out


# -- committing ----------------------------------------------------------------
class _Carry:
    """Deletes that landed on rewritten superfiles after the plan: carried to
    the new superfiles by ``_id`` (the ``rebuild`` of the optimize commit)."""

    def __init__(self, table: TableHandle, plan: OptimizePlan, entries: Sequence[dict],
                 request: CommitRequest) -> None:
        self._table, self._plan, self._entries, self._req = table, plan, entries, request
        self._new_ids: Optional[List[np.ndarray]] = None
        self._vectors: Dict[Tuple[str, bytes], str] = {}

    def request(self, base: Snapshot) -> CommitRequest:
        plan, table = self._plan, self._table
        if plan.new_grid is not None:
            held = base.properties.get("grid") or {}
            if held.get("sha256") != plan.grid["sha256"]:
                raise CommitConflictError(
                    f"{table.uri}: the grid changed since optimize planned on version "
                    f"{plan.version} (a concurrent optimize split cells); plan again")
        landed_ids = []
        reclaimed = 0
        for s in plan.sources:
            now = base.deletes.get(s.id, [])
            reclaimed += len(_deleted(table, now)) if now else 0
            extra = [p for p in now if p not in s.deletes]
            if extra:
                rows = _deleted(table, extra)
                rows = rows[~np.isin(rows, _deleted(table, s.deletes))]
                if len(rows):
                    landed_ids.append(_reader(table, s.entry).ids()[rows])
        add_deletes: Dict[str, str] = {}
        carried = 0
        if landed_ids:
            gone = np.concatenate(landed_ids)
            if self._new_ids is None:
                self._new_ids = [_reader(table, e).ids() for e in self._entries]
            for e, ids in zip(self._entries, self._new_ids):
                rows = np.where(np.isin(ids, gone))[0].astype(np.int64)
                if len(rows):
                    add_deletes[e["id"]] = self._vector(e["id"], rows)
                    carried += len(rows)
            _LOG.info("%s: optimize carries %d rows deleted since version %d over to the "
                      "rewritten superfiles", table.uri, carried, plan.version)
        return dataclasses.replace(self._req, add_deletes=add_deletes,
                                   deleted_rows=carried - reclaimed)

    def _vector(self, sf: str, rows: np.ndarray) -> str:
        key = (sf, rows.tobytes())
        if key not in self._vectors:
            path = dv.new_path()
            self._table.store.put_if_absent(path, dv.encode(rows))
            self._vectors[key] = path
        return self._vectors[key]


def commit_optimize(table: TableHandle, plan: OptimizePlan, entries: Sequence[dict], *,
                    token: Optional[str] = None, max_retries: Optional[int] = None) -> int:
    """Commits the rewrite once: removes the plan's superfiles, adds ``entries``.

    Args:
        entries: what ``rewrite_group`` returned for every group of the plan.
        token: idempotency token (default ``plan.token``: a rerun of the same
            plan, even from another process, commits once).

    Returns:
        The version holding the optimize (this handle moves to it).

    Raises:
        CommitConflictError: a concurrent commit removed a superfile of the
            plan or changed the grid this plan splits: plan again.
    """
    if plan.empty:
        raise ValueError("commit_optimize: the plan is empty; there is nothing to commit")
    rows_in = plan.rows_to_rewrite
    rows_out = sum(int(e["rows"]) for e in entries)
    if rows_in != rows_out:
        raise ValueError(f"commit_optimize: the plan rewrites {rows_in} live rows, the entries "
                         f"hold {rows_out}; pass the entries of every group exactly once")
    props, replace = {}, ()
    if plan.new_grid is not None:
        path = grid_mod.grid_path()
        table.store.put_if_absent(path, grid_mod.to_bytes(plan.centroids))
        props, replace = {"grid": {"path": path, **plan.new_grid}}, ("grid",)
    request = CommitRequest(
        operation=OPERATION, add_entries=tuple(sorted(entries, key=lambda e: e["id"])),
        remove_entries=tuple(s.id for s in plan.sources), set_properties=props,
        replace_properties=replace, token=token or plan.token, base_version=plan.version,
        metadata={"optimize": {k: v for k, v in plan.to_dict().items() if k != "groups"}},
        fingerprint_extra="remove=" + ",".join(sorted(s.id for s in plan.sources)))
    carry = _Carry(table, plan, request.add_entries, request)
    kwargs = {} if max_retries is None else {"max_retries": max_retries}
    return table.commit(request, rebuild=carry.request, **kwargs)


def optimize(table: TableHandle, *, target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
             max_cell_rows: Optional[int] = None, max_rewrite_bytes: Optional[int] = None,
             dry_run: bool = False, progress: Optional[Callable[[int, int], None]] = None,
             token: Optional[str] = None) -> Union[int, None, OptimizePlan]:
    """Plan, rewrite and commit on one machine (``Supertable.optimize``)."""
    for attempt in range(REPLAN_ATTEMPTS):
        plan = plan_optimize(table, target_file_bytes=target_file_bytes,
                             max_cell_rows=max_cell_rows, max_rewrite_bytes=max_rewrite_bytes)
        if dry_run:
            return plan
        if plan.empty:
            return None
        entries: List[dict] = []
        total = len(plan.groups)
        if progress is not None:
            progress(0, total)
        # Groups in parallel threads (Parquet, codes and uploads release the GIL).
        with ThreadPoolExecutor(max_workers=min(total, os.cpu_count() or 2)) as pool:
            futures = [pool.submit(rewrite_group, table, plan, g) for g in plan.groups]
            for done, future in enumerate(as_completed(futures), 1):
                entries.extend(future.result())
                if progress is not None:
                    progress(done, total)
        try:
            return commit_optimize(table, plan, entries, token=token)
        except CommitFailedError:
            raise
        except CommitConflictError as exc:
            if attempt == REPLAN_ATTEMPTS - 1:
                raise
            _LOG.info("%s: optimize planned on version %d conflicts (%s); planning again",
                      table.uri, plan.version, exc)
            table.refresh()
    raise AssertionError("unreachable")


# Defined in other modules; public under this module's name (repr, pickles).
for _public in (OptimizeGroup, OptimizePlan,):
    _public.__module__ = __name__
del _public
