"""inspect_table: every figure checked against a table whose contents the test knows."""

import dataclasses
import json
import os
import statistics

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import Supertable
from beam_supertable.format.documents import version_path
from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore
from beam_supertable.iceberg import metadata as iceberg
from beam_supertable.table.inspection import inspect_table
from beam_supertable.vector import grid as grid_mod

D = 8
N_CELLS = 4
APPENDS = (300, 200, 100)
DELETED = 50            # k < 50: all in the first append's superfile
FRONTIER_US = 1_764_700_000_000_000
SCHEMA = pa.schema([("k", pa.int64()), ("body", pa.string()),
                    ("emb", pa.list_(pa.float32(), D))])


def _rows(start, n, seed):
    x = np.random.default_rng(seed).normal(size=(n, D)).astype(np.float32)
    return pa.table({"k": np.arange(start, start + n), "body": [f"doc {i}" for i in range(n)],
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), D)}), x


@dataclasses.dataclass
class Known:
    """A table built by the test, and what the test knows of it."""

    uri: str
    options: dict
    table: Supertable
    vectors: np.ndarray          # every row ever committed, deleted ones included
    orphan: str                  # a superfile written but never committed
    superfile_paths: list


def build_known(uri, options=None) -> Known:
    """Version 0 create, 1-3 appends (one superfile each, the last with a
    frontier), 4 a delete of ``DELETED`` rows; then an uncommitted superfile."""
    t = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                          n_cells=N_CELLS, storage_options=options)
    start, vectors = 0, []
    for i, n in enumerate(APPENDS):
        data, x = _rows(start, n, seed=i)
        t.append(data, n_shards=1, frontier=FRONTIER_US if i == len(APPENDS) - 1 else None)
        start += n
        vectors.append(x)
    t.delete(pc.field("k") < DELETED)
    entries, _ = t.write_superfiles(_rows(10_000, 20, seed=9)[0], n_shards=1)
    return Known(uri, options, t, np.concatenate(vectors), entries[0]["path"],
                 [e["path"] for e in t.superfiles()])


def test_inspect_reports_a_known_table(table_location):
    uri, options = table_location
    known = build_known(uri, options)
    store = known.table.store
    report = inspect_table(uri, options)
    json.dumps(report)   # JSON data, nothing else

    assert report["uri"] == uri
    assert report["versions"] == {
        "latest": 4, "retained": 5, "oldest_retained": 0, "frontier": FRONTIER_US,
        "latest_commit": {"operation": "delete",
                          "timestamp": known.table.snapshot.commit["timestamp"]}}
    total = sum(APPENDS)
    assert report["rows"] == {"live": total - DELETED, "deleted": DELETED, "stored": total}

    sizes = [store.head(p).size for p in known.superfile_paths]
    sf = report["superfiles"]
    assert sf["count"] == len(APPENDS)
    assert sf["bytes"] == {"min": min(sizes), "median": statistics.median(sizes),
                           "max": max(sizes), "total": sum(sizes)}
    assert sf["rows"] == {"min": min(APPENDS), "median": statistics.median(APPENDS),
                          "max": max(APPENDS)}
    assert (sf["with_deletes"], sf["deletion_vectors"]) == (1, 1)

    # Rows per cell from the data itself: each row's nearest cell of the grid.
    cells, _ = grid_mod.assign(known.vectors, known.table.grid(), "l2")
    per_cell = np.bincount(cells)
    per_cell = per_cell[per_cell > 0].tolist()
    assert report["cells"] == {
        "count": len(per_cell), "superfiles_without_cell_rows": 0,
        "rows_per_cell": {"min": min(per_cell), "median": statistics.median(per_cell),
                          "max": max(per_cell)}}
    grid_id = known.table.properties["grid"]["sha256"]
    assert report["grids"] == [{"id": grid_id, "current": True, "n_cells": N_CELLS,
                                "superfiles": len(APPENDS), "rows": total,
                                "cells": len(per_cell)}]

    listing = store.list("")
    storage = report["storage"]
    assert storage["objects"] == len(listing)
    assert storage["bytes"] == sum(o.size for o in listing)
    orphan_bytes = store.head(known.orphan).size
    assert storage["by_area"]["data"] == {"objects": len(APPENDS) + 1,
                                          "bytes": sum(sizes) + orphan_bytes}
    dv = [o for o in listing if o.path.endswith(".dv")]
    assert storage["by_area"]["deletes"] == {"objects": 1, "bytes": dv[0].size}
    ice = [o for o in listing if o.path.startswith("metadata/") or o.path.endswith(".parquet")
           and o.path.startswith("deletes/")]
    assert storage["by_area"]["iceberg"] == {"objects": len(ice),
                                             "bytes": sum(o.size for o in ice)}
    ref = storage["referenced_by_latest"]
    assert ref["missing"] == []
    # Everything the latest version needs: its document, its parts, the grid,
    # the superfiles and the deletion vector, and its Iceberg metadata; not
    # older versions nor the orphan.
    snap = known.table.snapshot
    needed = {version_path(4), known.table.properties["grid"]["path"], dv[0].path,
              *known.superfile_paths, *(p.path for p in snap.parts),
              *(p for p in iceberg.referenced(store, snap) if store.exists(p))}
    assert ref == {"objects": len(needed), "bytes": sum(store.head(p).size for p in needed),
                   "missing": []}

    # The default grace protects the young orphan; nothing is reclaimable yet.
    assert report["vacuum"] == {
        "retain_versions": 10, "grace_s": 6 * 3600.0,
        "reclaimable": {"versions": 0, "objects": 0, "bytes": 0},
        "in_grace": {"objects": 1, "bytes": orphan_bytes}}

    # Without grace, keeping one version: versions 0-3 and the orphan go, and
    # that is exactly what the vacuum then removes.
    eager = inspect_table(uri, options, retain_versions=1, older_than=0)["vacuum"]
    # ... with their Iceberg metadata files and manifest lists.
    old_paths = [version_path(v) for v in range(4)] + \
        [iceberg.metadata_path(v) for v in range(4)] + \
        [iceberg.manifest_list_path(v) for v in range(1, 4)]
    old_versions = sum(store.head(p).size for p in old_paths)
    assert eager["reclaimable"] == {"versions": 4, "objects": len(old_paths) + 1,
                                    "bytes": old_versions + orphan_bytes}
    assert eager["in_grace"] == {"objects": 0, "bytes": 0}
    removed = known.table.vacuum(retain_versions=1, older_than=0)
    assert (len(removed.removed_versions), len(removed.removed_objects),
            removed.removed_bytes) == (4, len(old_paths) + 1, old_versions + orphan_bytes)
    after = inspect_table(uri, options, retain_versions=1, older_than=0)
    assert after["versions"]["retained"] == 1 and after["versions"]["oldest_retained"] == 4
    assert after["vacuum"]["reclaimable"] == {"versions": 0, "objects": 0, "bytes": 0}
    assert after["rows"] == report["rows"] and after["cells"] == report["cells"]


def test_inspect_never_reads_superfile_data(tmp_path):
    uri = str(tmp_path / "t")
    known = build_known(uri)
    before = inspect_table(uri)
    # Same sizes, garbage content: a read of any superfile or deletion
    # vector would fail or change a figure.
    for folder in ("data", "deletes"):
        for name in os.listdir(tmp_path / "t" / folder):
            path = tmp_path / "t" / folder / name
            path.write_bytes(b"\0" * path.stat().st_size)
    assert inspect_table(uri) == before
    with pytest.raises(pa.ArrowInvalid):
        Supertable.open(uri).to_arrow()   # the data really is unreadable now
    assert known.orphan.startswith("data/")


def test_inspect_a_table_without_vectors_or_rows(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("x", pa.int64())]))
    empty = inspect_table(uri)
    assert empty["superfiles"]["count"] == 0 and empty["superfiles"]["rows"] is None
    assert empty["rows"] == {"live": 0, "deleted": 0, "stored": 0}
    t.append(pa.table({"x": [1, 2, 3]}))
    report = inspect_table(uri)
    assert report["cells"] == {"count": 0, "rows_per_cell": None,
                               "superfiles_without_cell_rows": 0}
    assert report["grids"] == []
    assert report["superfiles"]["rows"] == {"min": 3, "median": 3, "max": 3}


def test_inspect_reports_grids_unknown_cell_rows_and_missing_objects(tmp_path):
    # Entries of an older writer (no per-cell row counts) on two grids, one of
    # them older than the stamped grid, and a referenced object that is gone.
    uri = str(tmp_path / "t")
    store = ObjectStore(uri)
    m = Manifest(store)
    m.create(pa.schema([("_id", pa.int64()), ("x", pa.int64())]))
    store.put_if_absent("data/a.sf.parquet", b"a" * 100)
    stamp = {"path": "_supertable/grid/new.npy", "n_cells": 3, "sha256": "new"}
    store.put_if_absent(stamp["path"], b"g" * 10)
    entries = (
        {"id": "a", "path": "data/a.sf.parquet", "rows": 10, "bytes": 100,
         "cells": [0, 1], "grid": "old"},
        {"id": "b", "path": "data/b.sf.parquet", "rows": 5, "bytes": 50,
         "cells": [0], "grid": "new"},
        {"id": "c", "path": "data/c.sf.parquet", "rows": 7, "bytes": 70,
         "cells": [0, 2], "cell_rows": [3, 4], "grid": "new"},
    )
    m.commit(CommitRequest(add_entries=entries, set_properties={"grid": stamp}))
    report = inspect_table(uri)
    assert report["cells"] == {"count": 4, "rows_per_cell": None,
                               "superfiles_without_cell_rows": 1}
    assert report["grids"] == [
        {"id": "new", "current": True, "n_cells": 3, "superfiles": 2, "rows": 12, "cells": 2},
        {"id": "old", "current": False, "n_cells": None, "superfiles": 1, "rows": 10,
         "cells": 2}]
    assert report["storage"]["referenced_by_latest"]["missing"] == [
        "data/b.sf.parquet", "data/c.sf.parquet"]
    assert report["superfiles"]["bytes"]["total"] == 220   # from the entries


def test_superfile_entries_record_rows_per_cell(tmp_path):
    known = build_known(str(tmp_path / "t"))
    for entry in known.table.superfiles():
        assert len(entry["cell_rows"]) == len(entry["cells"])
        assert sum(entry["cell_rows"]) == entry["rows"]


def test_plan_vacuum_is_what_vacuum_removes(tmp_path):
    uri = str(tmp_path / "t")
    known = build_known(uri)
    manifest = Manifest(known.table.store)
    plan = manifest.plan_vacuum(retain_versions=2, older_than=0)
    assert plan.report() == known.table.vacuum(retain_versions=2, older_than=0, dry_run=True)
    assert known.orphan in {o.path for o in plan.removed_objects}
    assert plan.removed_versions == (0, 1, 2) and plan.retained_versions == (3, 4)
    report = known.table.vacuum(retain_versions=2, older_than=0)
    assert report == plan.report()
    assert not any(known.table.store.exists(p) for p in report.removed_objects)
    assert Supertable.open(uri).count_rows() == sum(APPENDS) - DELETED
    with pytest.raises(ValueError, match="retain_versions"):
        manifest.plan_vacuum(retain_versions=0)


def test_inspect_counts_objects_by_kind_and_reports_the_token_horizon(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("x", pa.int64())]), token_retention=3600)
    for i in range(5):
        t.append(pa.table({"x": [i]}), token=f"slot-{i}")
    (tmp_path / "t" / "data" / "failed-attempt.sf.parquet").write_bytes(b"x" * 10)
    report = inspect_table(uri, older_than=0)
    kinds = report["storage"]["by_kind"]
    assert kinds["versions"]["objects"] == 6 and kinds["token_markers"]["objects"] == 5
    assert kinds["claims"]["objects"] >= 1 and kinds["superfiles"]["objects"] == 5
    assert kinds["orphans"] == {"objects": 1, "bytes": 10}
    assert sum(k["objects"] for k in kinds.values()) == report["storage"]["objects"]
    assert report["tokens"] == {"retention_s": 3600.0, "markers": 5, "index_objects": 0,
                                "horizon": t.snapshot.commit["token_horizon"]}
    t.vacuum(retain_versions=1, older_than=0)
    kinds = inspect_table(uri, older_than=0)["storage"]["by_kind"]
    assert kinds["versions"]["objects"] == 1 and kinds["orphans"]["objects"] == 0
    assert kinds["token_markers"]["objects"] == 1 and kinds["token_index"]["objects"] == 1
