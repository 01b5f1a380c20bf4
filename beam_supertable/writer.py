"""Turning one append's rows into uploaded superfiles and their manifest entries.

Shared by ``Supertable.append`` and the Beam ``WriteToSupertable``: shard the
rows (``cell % n_shards`` with a vector column, by bytes otherwise), build each
shard's superfile, upload it under a fresh name, return its entry.
"""

from __future__ import annotations

import math
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Sequence

import numpy as np
import pyarrow as pa

from beam_supertable import superfile
from beam_supertable.digest import row_digest
from beam_supertable.filters import column_stats, null_counts
from beam_supertable.ids import new_ids
from beam_supertable.keys import key_stats
from beam_supertable.schema import ID
from beam_supertable.store import ObjectStore
from beam_supertable.superfile import VectorSpec
from beam_supertable.vector import grid as grid_mod

DATA = "data"
TARGET_SUPERFILE_BYTES = 64 << 20


@dataclass(frozen=True)
class Layout:
    """What the writer needs to know of the table."""

    vector: Optional[VectorSpec]
    fts_columns: Sequence[str]
    stop_words: FrozenSet[str]
    replica_factor: float = 0.0
    target_bytes: int = TARGET_SUPERFILE_BYTES
    primary_key: Sequence[str] = ()


def shard_count(table: pa.Table, layout: Layout, n_shards: Optional[int]) -> int:
    if n_shards is not None:
        return n_shards
    return max(1, math.ceil(table.nbytes / layout.target_bytes))


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
    full = table.add_column(0, pa.field(ID, pa.int64(), nullable=False), pa.array(ids))
    data, summary = superfile.build(
        full, vector=layout.vector, cells=cells, replica_cells=replicas,
        fts_columns=layout.fts_columns, stop_words=layout.stop_words,
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
        vectors = superfile.vectors_of(table, layout.vector.column, layout.vector.dim)
        cells, replicas = grid_mod.assign(vectors, centroids, layout.vector.metric,
                                          layout.replica_factor)
    groups = shards(table, cells, shard_count(table, layout, n_shards))

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
