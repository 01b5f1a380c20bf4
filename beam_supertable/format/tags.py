"""Tags: names for versions, which ``vacuum`` keeps.

A tag is one small sealed JSON object, ``_supertable/tags/<name>.json``,
naming a version. It is created with the store's atomic create-if-absent, so
of two writers creating one name exactly one wins; the other is refused. A
tagged version keeps everything it needs (its manifest, superfiles, deletion
vectors and Iceberg metadata) through every ``vacuum``, however few versions
it retains, until the tag is deleted.

Creating a tag records it first and then checks its version is still there
(undone when not): a vacuum that planned before the record sees it on its
second look, just before deleting anything (as for consumers).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Dict, Optional, Sequence

from beam_supertable.errors import AlreadyExists, CorruptManifestError, TagExistsError
from beam_supertable.format.documents import FORMAT_VERSION, META, iso_of, seal, unseal
from beam_supertable.format import named
from beam_supertable.format.store import ObjectInfo, ObjectStore

TAGS = f"{META}/tags"

_LOG = logging.getLogger(__name__)
_NAME = named.NAME


def check_name(name: Any) -> str:
    """A tag name: 1-128 letters, digits, ``.``, ``_`` or ``-``, starting with a letter
    or digit, and not all digits (a number is a version)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.isdigit():
        raise ValueError(f"tag name must be 1-128 letters, digits, '.', '_' or '-' starting "
                         f"with a letter or digit and not all digits, got {name!r}")
    return name


def path_of(name: str) -> str:
    return f"{TAGS}/{check_name(name)}.json"


def _document(name: str, version: int, now: float) -> bytes:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"tag {name!r}: version must be an int >= 0, got {version!r}")
    # The nonce makes every creation's bytes unique: a remote create that finds
    # identical bytes counts as its own retry, and two creators must not both win.
    return seal({"format_version": FORMAT_VERSION, "kind": "tag", "name": name,
                 "version": version, "created_at": iso_of(now), "nonce": uuid.uuid4().hex})


def create(store: ObjectStore, name: str, version: int, now: float) -> None:
    """Creates tag ``name`` on ``version``.

    Raises:
        TagExistsError: a tag of that name exists (another creator won).
    """
    path = path_of(name)
    try:
        store.put_if_absent(path, _document(name, version, now))
    except AlreadyExists:
        raise TagExistsError(f"{store.uri}: tag {name!r} already exists (on version "
                            f"{recorded(store, name)}); delete it first") from None


def replace(store: ObjectStore, name: str, version: int, now: float) -> None:
    """Points the existing tag ``name`` at ``version`` (a plain overwrite)."""
    store.put(path_of(name), _document(name, version, now))


def _decode(data: bytes, where: str) -> Dict[str, Any]:
    doc = unseal(data, where)
    version = doc.get("version")
    if doc.get("kind") != "tag" or isinstance(version, bool) or not isinstance(version, int) \
            or version < 0:
        raise CorruptManifestError(f"{where}: not a tag record (delete it with tags.delete or "
                                   "`beam-supertable tag TABLE delete NAME`)")
    return doc


def recorded(store: ObjectStore, name: str) -> Optional[int]:
    """The version tag ``name`` names, or None when there is no such tag."""
    path = path_of(name)
    try:
        data = store.get(path)
    except FileNotFoundError:
        return None
    return _decode(data, f"{store.uri}/{path}")["version"]


def listing(store: ObjectStore, objects: Optional[Sequence[ObjectInfo]] = None, *,
            skip_unreadable: bool = False) -> Dict[str, int]:
    """Every tag of the table: name -> version, by name.

    ``objects``: the table's listing when the caller has one. ``skip_unreadable``:
    a record that is not one is logged and left out instead of raising
    ``CorruptManifestError`` (a vacuum goes on; it holds nothing)."""
    out = {name: doc["version"] for name, doc in named.read_all(
        store, TAGS, _decode, objects, accept=lambda name: not name.isdigit(),
        skip_unreadable=skip_unreadable, log=_LOG)}
    return dict(sorted(out.items()))


def delete(store: ObjectStore, name: str) -> bool:
    """Removes tag ``name``; False when there was none."""
    path = path_of(name)
    if not store.exists(path):
        return False
    store.delete(path)
    return True
