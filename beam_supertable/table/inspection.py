"""What an operator needs to know of a table at a glance, from its manifests only.

``inspect_table`` reads the latest version document, its manifest parts and
one listing of the table's prefix; it never opens a superfile or a deletion
vector, so it costs the same on a table of ten superfiles or ten thousand
(apart from the listing). The report is JSON data::

    {"uri": ...,
     "versions": {"latest", "retained", "oldest_retained", "frontier",
                  "latest_commit": {"operation", "timestamp"}},
     "rows": {"live", "deleted", "stored"},
     "superfiles": {"count", "target_bytes",
                    "bytes": {"min", "median", "max", "total"},
                    "rows": {"min", "median", "max"},
                    "with_deletes", "deletion_vectors"},
     "cells": {"count", "rows_per_cell": {"min", "median", "max"} | None,
               "superfiles_without_cell_rows"},
     "grids": [{"id", "current", "n_cells", "superfiles", "rows", "cells"}],
     "storage": {"objects", "bytes", "by_area": {area: {"objects", "bytes"}},
                 "by_kind": {kind: {"objects", "bytes"}},
                 "referenced_by_latest": {"objects", "bytes", "missing"}},
     "tokens": {"retention_s", "horizon", "markers", "index_objects"},
     "schema": {"columns": [{"name", "id", "type"}], "last_column_id",
                "history": [{"version", "change"}]},
     "consumers": {"expiry_s", "list": [{"name", "version", "updated_at", "age_s",
                                         "expired"}],
                   "held": {"versions", "bytes"}},
     "tags": {"list": [{"name", "version"}], "held": {"versions", "bytes"}},
     "vacuum": {"retain_versions", "grace_s",
                "reclaimable": {"versions", "objects", "bytes"},
                "in_grace": {"objects", "bytes"}}}

``by_kind`` sorts every object into one of ``KINDS``: versions, manifest parts,
token markers, token index objects, superfiles (with their index objects),
deletion vectors, id claims, Iceberg metadata, orphans (objects in the
table's own areas that no version the reported vacuum keeps references: the
leftovers of failed attempts and the files of versions it would remove) and
other (the hint, grids, what is not ours). ``tokens.horizon`` is the horizon the
latest version recorded when it committed (its commit time less the token
retention): reruns of commits made since are deduplicated; at a later moment
``t`` the horizon in force is ``t - retention_s``.

``consumers`` lists the change feed's named readers with the version each
has read to; ``held`` is what they cost the reported vacuum: the versions it
keeps only for them and the bytes only those versions reference.
``tags`` lists the table's tags (names for versions vacuum keeps) and, in
``held``, the versions kept only for them and the bytes only those reference.

Rows per cell count the rows stored in a cell (deleted ones included, until
an optimize drops them); a superfile written before entries recorded
``cell_rows`` and spanning several cells leaves them unknown, and then
``rows_per_cell`` is None rather than a guess.
"""

from __future__ import annotations

import datetime
import statistics
from typing import Any, Dict, Iterable, List, Optional, Union

from beam_supertable.format import fields
from beam_supertable.format import ids
from beam_supertable.format.consumers import CONSUMERS, consumer_expiry_of
from beam_supertable.format.documents import (
    PARTS, TOKEN_INDEX, TOKENS, VERSIONS, token_retention_of, version_of)
from beam_supertable.format.manifest import Manifest, Snapshot, VacuumPlan
from beam_supertable.format.store import ObjectInfo, ObjectStore
from beam_supertable.format.writer import TARGET_SUPERFILE_BYTES
from beam_supertable.iceberg import metadata as iceberg_meta
from beam_supertable.table.mutation import FRONTIER

__all__ = ["KINDS", "inspect_table"]

KINDS = ("versions", "parts", "token_markers", "token_index", "superfiles",
         "deletion_vectors", "claims", "consumers", "iceberg", "orphans", "other")

# Where objects live under a table's root, for the storage breakdown.
_AREAS = (("data", "data/"), ("deletes", "deletes/"), ("metadata", "_supertable/"),
          ("iceberg", "metadata/"))


def _area(path: str) -> str:
    if path.endswith(".pos.parquet"):
        return "iceberg"   # a deletion vector as an Iceberg position delete file
    return next((name for name, prefix in _AREAS if path.startswith(prefix)), "other")


def _kind(path: str) -> str:
    if path.endswith(".pos.parquet") or path.startswith("metadata/"):
        return "iceberg"
    for prefix, kind in ((VERSIONS + "/", "versions"), (PARTS + "/", "parts"),
                         (TOKEN_INDEX + "/", "token_index"), (TOKENS + "/", "token_markers"),
                         (ids.CLAIMS + "/", "claims"), (CONSUMERS + "/", "consumers"),
                         ("data/", "superfiles"),
                         ("deletes/", "deletion_vectors")):
        if path.startswith(prefix):
            return kind
    return "other"


def _by_kind(objects: List[ObjectInfo], plan: VacuumPlan) -> Dict[str, Dict[str, int]]:
    unreferenced = {i.path for i in plan.removed_objects + plan.waiting_objects}
    out = {kind: {"objects": 0, "bytes": 0} for kind in KINDS}
    for o in objects:
        kind = _kind(o.path)
        if o.path in unreferenced and kind in ("parts", "superfiles", "deletion_vectors",
                                               "other"):
            kind = "orphans"
        out[kind]["objects"] += 1
        out[kind]["bytes"] += o.size
    return out


def _tokens(snapshot: Snapshot, objects: List[ObjectInfo]) -> Dict[str, Any]:
    kinds = [_kind(o.path) for o in objects]
    retention = token_retention_of(snapshot.properties)
    return {"retention_s": retention, "horizon": snapshot.commit.get("token_horizon"),
            "markers": kinds.count("token_markers"), "index_objects": kinds.count("token_index")}


def inspect_table(uri: str, storage_options: Optional[dict] = None, *,
                  retain_versions: int = 10,
                  older_than: Union[float, datetime.timedelta, None] = None) -> Dict[str, Any]:
    """A JSON-able summary of the table at ``uri``: versions, rows, superfiles,
    cells, grids, storage and what a vacuum would reclaim.

    Args:
        uri: the table's location (local path, ``memory://``, ``s3://``...).
        storage_options: passed to fsspec, as for ``Supertable.open``.
        retain_versions: the vacuum whose reclaimable bytes are reported
            keeps this many versions (as ``vacuum``'s argument).
        older_than: and this grace period (seconds or a ``timedelta``;
            ``None`` is the default grace of ``vacuum``, 6 hours).

    Returns:
        The report described in the module docstring.

    Raises:
        NotATableError: nothing at ``uri`` is a supertable.
        ValueError: a bad ``retain_versions`` or ``older_than``.
    """
    store = ObjectStore(uri, storage_options)
    manifest = Manifest(store)
    # The version first, then the listing: whatever the version references
    # was written before it, so the listing holds it (a commit landing in
    # between only adds objects). What this process committed is counted
    # with its Iceberg metadata, which is written beside the commit.
    iceberg_meta.settle(store)
    snapshot = manifest.load()
    objects = store.list("")
    plan = manifest.plan_vacuum(retain_versions=retain_versions, older_than=older_than,
                                objects=objects)
    entries = snapshot.entries()
    sizes = {o.path: o.size for o in objects}
    return {
        "uri": uri,
        "versions": _versions(snapshot, objects),
        "rows": _rows(snapshot),
        "superfiles": _superfiles(snapshot, entries, sizes),
        "cells": _cells(entries),
        "grids": _grids(snapshot, entries),
        "storage": {**_storage(manifest, snapshot, objects, sizes),
                    "by_kind": _by_kind(objects, plan)},
        "tokens": _tokens(snapshot, objects),
        "schema": {"columns": fields.describe(snapshot.schema),
                   "last_column_id": fields.last_column_id(snapshot.schema, snapshot.properties),
                   "history": list(snapshot.properties.get(fields.SCHEMA_HISTORY) or [])},
        "consumers": {"expiry_s": consumer_expiry_of(snapshot.properties),
                      "list": [c.to_dict() for c in plan.consumers],
                      "held": {"versions": len(plan.held_versions)
                               - len(plan.tag_held_versions),
                               "bytes": plan.held_bytes - plan.tag_held_bytes}},
        "tags": {"list": [{"name": n, "version": v} for n, v in plan.tags.items()],
                 "held": {"versions": len(plan.tag_held_versions),
                          "bytes": plan.tag_held_bytes}},
        "vacuum": {
            "retain_versions": retain_versions,
            "grace_s": plan.grace_s,
            "reclaimable": {"versions": len(plan.removed_versions),
                            "objects": len(plan.removed_objects),
                            "bytes": plan.removed_bytes},
            "in_grace": {"objects": len(plan.waiting_objects), "bytes": plan.waiting_bytes},
        },
    }


def _spread(values: List[int], total: bool = False) -> Optional[Dict[str, Any]]:
    """min / median / max (and total) of ``values``; None when there are none."""
    if not values:
        return None
    out: Dict[str, Any] = {"min": min(values), "median": statistics.median(values),
                           "max": max(values)}
    if total:
        out["total"] = sum(values)
    return out


def _versions(snapshot: Snapshot, objects: Iterable[ObjectInfo]) -> Dict[str, Any]:
    listed = sorted(v for v in (version_of(o.path) for o in objects)
                    if v is not None and v <= snapshot.version)
    return {
        "latest": snapshot.version,
        "retained": len(listed),
        "oldest_retained": listed[0] if listed else snapshot.version,
        "frontier": snapshot.properties.get(FRONTIER),
        "latest_commit": {"operation": snapshot.commit.get("operation"),
                          "timestamp": snapshot.commit.get("timestamp")},
    }


def _rows(snapshot: Snapshot) -> Dict[str, int]:
    stored = int(snapshot.totals.get("rows", 0))
    deleted = int(snapshot.totals.get("deleted", 0))
    return {"live": stored - deleted, "deleted": deleted, "stored": stored}


def _superfiles(snapshot: Snapshot, entries: List[dict],
                sizes: Dict[str, int]) -> Dict[str, Any]:
    nbytes = [int(e.get("bytes") or sizes.get(e["path"], 0)) for e in entries]
    with_deletes = [e["id"] for e in entries if snapshot.deletes.get(e["id"])]
    return {
        "count": len(entries),
        "target_bytes": int(snapshot.properties.get("target_superfile_bytes",
                                                    TARGET_SUPERFILE_BYTES)),
        "bytes": _spread(nbytes, total=True) or {"min": 0, "median": 0, "max": 0, "total": 0},
        "rows": _spread([int(e["rows"]) for e in entries]),
        "with_deletes": len(with_deletes),
        "deletion_vectors": sum(len(snapshot.deletes[sf]) for sf in with_deletes),
    }


def _cell_rows(entry: dict) -> Optional[List[int]]:
    """Rows the superfile stores per cell (aligned with ``entry["cells"]``), if known."""
    if "cell_rows" in entry:
        return [int(n) for n in entry["cell_rows"]]
    if len(entry["cells"]) == 1:
        return [int(entry["rows"])]   # one cell holds every row
    return None


def _cells(entries: List[dict]) -> Dict[str, Any]:
    # A cell is named by its grid and its number: a grid made by a split is
    # another set of cells, even where numbers coincide.
    rows: Dict[tuple, int] = {}
    unknown = 0
    for e in entries:
        if not e.get("cells"):
            continue
        counts = _cell_rows(e)
        if counts is None:
            unknown += 1
        for i, cell in enumerate(e["cells"]):
            key = (e.get("grid"), int(cell))
            rows[key] = rows.get(key, 0) + (counts[i] if counts is not None else 0)
    return {
        "count": len(rows),
        "rows_per_cell": None if unknown else _spread(list(rows.values())),
        "superfiles_without_cell_rows": unknown,
    }


def _grid_stamps(properties: Dict[str, Any]) -> Dict[str, dict]:
    """Every grid stamp the properties hold, by id: ``{"path", "n_cells", "sha256"}``
    dicts, alone or in lists (the current grid and any versions kept beside it)."""
    found: Dict[str, dict] = {}
    for value in properties.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and isinstance(item.get("sha256"), str) \
                    and "n_cells" in item:
                found[item["sha256"]] = item
    return found


def _grids(snapshot: Snapshot, entries: List[dict]) -> List[Dict[str, Any]]:
    stamps = _grid_stamps(snapshot.properties)
    current = (snapshot.properties.get("grid") or {}).get("sha256")
    by_id: Dict[str, Dict[str, Any]] = {}
    cells: Dict[str, set] = {}
    for e in entries:
        grid = e.get("grid")
        if grid is None:
            continue
        g = by_id.setdefault(grid, {"id": grid, "current": grid == current,
                                    "n_cells": (stamps.get(grid) or {}).get("n_cells"),
                                    "superfiles": 0, "rows": 0, "cells": 0})
        g["superfiles"] += 1
        g["rows"] += int(e["rows"])
        cells.setdefault(grid, set()).update(int(c) for c in e.get("cells", ()))
    for grid, g in by_id.items():
        g["cells"] = len(cells[grid])
    if current is not None and current not in by_id:
        # Stamped but holding no rows (every superfile on it was rewritten).
        by_id[current] = {"id": current, "current": True,
                          "n_cells": (stamps.get(current) or {}).get("n_cells"),
                          "superfiles": 0, "rows": 0, "cells": 0}
    return sorted(by_id.values(), key=lambda g: (not g["current"], g["id"]))


def _storage(manifest: Manifest, snapshot: Snapshot, objects: List[ObjectInfo],
             sizes: Dict[str, int]) -> Dict[str, Any]:
    by_area: Dict[str, Dict[str, int]] = {}
    for o in objects:
        area = _area(o.path)
        slot = by_area.setdefault(area, {"objects": 0, "bytes": 0})
        slot["objects"] += 1
        slot["bytes"] += o.size
    referenced = manifest.referenced(snapshot)
    # Iceberg metadata not written yet is derived and written on demand, not missing.
    present = [p for p in referenced | manifest.derived_referenced(snapshot) if p in sizes]
    return {
        "objects": len(objects),
        "bytes": sum(o.size for o in objects),
        "by_area": by_area,
        "referenced_by_latest": {
            "objects": len(present),
            "bytes": sum(sizes[p] for p in present),
            # Referenced but not listed: a damaged table (reads will fail).
            "missing": sorted(p for p in referenced if p not in sizes),
        },
    }
