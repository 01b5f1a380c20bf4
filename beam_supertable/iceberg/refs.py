"""The table's tags as Iceberg tag refs (``"refs": {"<tag>": {"snapshot-id": N,
"type": "tag"}}``) in a metadata document."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

__all__ = ["with_tags"]


def _fields(table: Optional[Dict[str, Any]]) -> Any:
    schemas = (table or {}).get("schemas") or [{}]
    return schemas[0].get("fields")


def with_tags(document: Dict[str, Any], tags: Dict[str, int],
              table_json: Callable[[int], Optional[Dict[str, Any]]]) -> Dict[str, Any]:
    """``document`` (a metadata document, changed in place) with one tag ref per tag
    whose snapshot it lists, and no other tag refs.

    A tagged snapshot the history left out (older than the snapshots a metadata
    file lists) is taken from its own version's metadata (``table_json(N)``)
    when that has the same schema; a tag on a version past the document's
    current snapshot, or named ``main``, is left out.
    """
    refs = {name: ref for name, ref in document.get("refs", {}).items()
            if ref.get("type") != "tag"}
    snapshots = list(document.get("snapshots", ()))
    listed = {s["snapshot-id"] for s in snapshots}
    current = document.get("current-snapshot-id")
    for name, version in tags.items():
        if name == "main" or current is None or version > current:
            continue
        if version not in listed:
            own = table_json(version) if version > 0 else None
            found = [s for s in (own or {}).get("snapshots", ())
                     if s.get("snapshot-id") == version]
            if not found or _fields(own) != _fields(document):
                continue
            snapshot = dict(found[0])
            if snapshot.get("parent-snapshot-id") not in listed:
                snapshot.pop("parent-snapshot-id", None)
            snapshots.append(snapshot)
            listed.add(version)
        refs[name] = {"snapshot-id": version, "type": "tag"}
    document["snapshots"] = sorted(snapshots, key=lambda s: s["snapshot-id"])
    document["refs"] = refs
    return document
