"""Turning a write's rows into uploaded superfiles and their manifest entries.

Shared by ``Supertable.append``/``upsert`` and the Beam ``WriteToSupertable``:
assign cells on the table's grid, shard the rows (``cell % n_shards`` with a
vector column, by bytes otherwise), build each shard's superfile, upload it
under a fresh name, return its entry. ``GridAgreement`` puts one commit's
superfiles on one grid, whichever grid each was built against.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from beam_supertable.format import superfile
from beam_supertable.format.digest import row_digest
from beam_supertable.format.documents import Snapshot
from beam_supertable.format.filters import column_stats, null_counts
from beam_supertable.format.fields import FIELD_ID, field_id
from beam_supertable.format.ids import new_ids
from beam_supertable.format.keys import key_stats
from beam_supertable.format.schema import ID
from beam_supertable.format.store import ObjectStore
from beam_supertable.format.superfile import VectorSpec
from beam_supertable.fts.analysis import Analyzer
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector.metric import vectors_of

_LOG = logging.getLogger(__name__)

DATA = "data"
TARGET_SUPERFILE_BYTES = 64 << 20


@dataclass(frozen=True)
class Layout:
    """What the writer needs to know of the table."""

    vector: Optional[VectorSpec]
    fts_columns: Sequence[str]
    analysis: Analyzer
    replica_factor: float = 0.0
    target_bytes: int = TARGET_SUPERFILE_BYTES
    primary_key: Sequence[str] = ()


def shard_count(nbytes: int, layout: Layout, n_shards: Optional[int] = None) -> int:
    """``n_shards`` if given, else one shard per ``layout.target_bytes`` of input."""
    if n_shards is not None:
        return n_shards
    return max(1, math.ceil(nbytes / layout.target_bytes))


def assign_cells(table: pa.Table, layout: Layout, centroids: np.ndarray
                 ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Each row's cell on the grid ``centroids``, and its replica cell (or None)."""
    vectors = vectors_of(table, layout.vector.column, layout.vector.dim)
    return grid_mod.assign(vectors, centroids, layout.vector.metric, layout.replica_factor)


def shards(table: pa.Table, cells: Optional[np.ndarray], n: int) -> List[np.ndarray]:
    """Row indices of each shard: by ``cell % n``, or contiguous by size."""
    if n <= 1:
        return [np.arange(table.num_rows)]
    if cells is not None:
        key = cells % n
        return [np.where(key == s)[0] for s in range(n) if (key == s).any()]
    bounds = np.linspace(0, table.num_rows, n + 1).astype(np.int64)
    return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def build_and_upload(store: ObjectStore, table: pa.Table, layout: Layout,
                     cells: Optional[np.ndarray], replicas: Optional[np.ndarray],
                     grid_id: Optional[str], ids: Optional[np.ndarray] = None) -> dict:
    """One superfile from ``table`` (user columns; ``_id`` added unless given)."""
    if ids is None:
        ids = new_ids(store, table.num_rows)
    id_field = pa.field(ID, pa.int64(), nullable=False, metadata={FIELD_ID: b"1"})
    full = table.add_column(0, id_field, pa.array(ids))
    data, summary = superfile.build(
        full, vector=layout.vector, cells=cells, replica_cells=replicas,
        fts_columns=layout.fts_columns, analysis=layout.analysis,
        key_columns=layout.primary_key)
    section = summary.pop("key_section", None)
    sf = uuid.uuid4().hex
    path = f"{DATA}/{sf}.sf.parquet"
    store.put_if_absent(path, data)
    entry = {
        "id": sf, "path": path, "rows": table.num_rows, "bytes": len(data),
        "id_min": int(ids.min()) if len(ids) else None,
        "id_max": int(ids.max()) if len(ids) else None,
        "stats": column_stats(table),
        "null_counts": null_counts(table),
        "digest": row_digest(table),   # what the rows are, for commit fingerprints
        **summary,
    }
    ids_of = {f.name: field_id(f) for f in full.schema if field_id(f) is not None}
    if ids_of:   # whose statistics they are: a filter prunes by field id after renames
        entry["field_ids"] = ids_of
    if layout.primary_key and table.num_rows:
        # Key range and bloom filter: an upsert finds where its keys live
        # from the manifest and reads only those superfiles' key columns.
        entry["keys"] = key_stats(table, layout.primary_key)
        if section is not None:
            entry["keys"]["section"] = section
    if grid_id is not None:
        entry["grid"] = grid_id
    return entry


def write_superfiles(store: ObjectStore, table: pa.Table, layout: Layout,
                     centroids: Optional[np.ndarray], grid_id: Optional[str],
                     n_shards: Optional[int] = None) -> List[dict]:
    """Shards, builds (in parallel threads) and uploads; returns the entries."""
    cells = replicas = None
    if layout.vector is not None:
        cells, replicas = assign_cells(table, layout, centroids)
    groups = shards(table, cells, shard_count(table.nbytes, layout, n_shards))

    def one(rows):
        take = pa.array(rows)
        return build_and_upload(
            store, table.take(take), layout,
            None if cells is None else cells[rows],
            None if replicas is None else replicas[rows], grid_id)

    if len(groups) == 1:
        return [one(groups[0])]
    with ThreadPoolExecutor(max_workers=min(len(groups), os.cpu_count() or 2)) as pool:
        return list(pool.map(one, groups))


class GridAgreement:
    """Puts one commit's superfiles on one grid, agreed on each base it tries.

    A writer builds superfiles against the grid it knows: the table's, or one
    it trained (``Supertable.train_grid``) while the table had none, which the
    commit stamps. Another writer may stamp its own grid first; then, on the
    base holding it, the superfiles built against another grid are rebuilt
    against the base's: the same rows under the same ``_id`` s, new cells. On
    a base without a grid the candidate with the least sha256 is stamped, so
    the writers of one commit whose shards trained different grids agree.
    Rebuilt entries are kept per grid: a retry rebuilds nothing twice.

    Args:
        store: the table's store (superfiles are uploaded there).
        layout: the table's layout.
        read_rows: an entry's rows, ``_id`` and every user column (the
            committing handle's reader, so rebuilding shares its cache).
        entries: the uploaded, uncommitted superfiles' entries.
        grids: stamps of grids the entries may be built against that the
            table may not hold yet.
    """

    def __init__(self, store: ObjectStore, layout: Layout,
                 read_rows: Callable[[dict], pa.Table], entries: Sequence[dict],
                 grids: Iterable[dict] = ()) -> None:
        self._store = store
        self._layout = layout
        self._read_rows = read_rows
        self._entries = tuple(entries)
        self._grids = {g["sha256"]: g for g in grids}
        self._ready: Dict[str, Tuple[dict, ...]] = {}

    def on(self, base: "Snapshot") -> Tuple[Dict[str, Any], Tuple[dict, ...]]:
        """``(properties to stamp, entries all on one grid)`` for a commit on ``base``."""
        held = base.properties.get("grid")
        if held is not None:
            target, stamp = held, {}
        elif self._grids:
            target = self._grids[min(self._grids)]
            stamp = {"grid": target}
        else:
            return {}, self._entries   # no vector index, or nothing built against a grid
        ready = self._ready.get(target["sha256"])
        if ready is None:
            stale = {e["id"] for e in self._entries
                     if e.get("grid") not in (None, target["sha256"])}
            centroids = None
            if stale:
                _LOG.info("%s: %d superfile(s) built on another grid than %s; rebuilding them "
                          "on it", self._store.uri, len(stale), target["sha256"][:12])
                centroids = grid_mod.from_bytes(self._store.get(target["path"]))
            ready = self._ready[target["sha256"]] = tuple(
                self._rebuild(e, centroids, target["sha256"]) if e["id"] in stale else e
                for e in self._entries)
        return stamp, ready

    def _rebuild(self, entry: dict, centroids: np.ndarray, grid_id: str) -> dict:
        """The same rows (same ``_id`` s) rebuilt into a superfile on another grid."""
        rows = self._read_rows(entry)
        user = rows.drop_columns([ID])
        cells, replicas = assign_cells(user, self._layout, centroids)
        return build_and_upload(self._store, user, self._layout, cells, replicas, grid_id,
                                ids=rows.column(ID).to_numpy())
