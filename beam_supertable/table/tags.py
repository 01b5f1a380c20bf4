"""Tags of a table (``Supertable.tags``): names for versions that ``vacuum`` keeps.

The shape is LanceDB's ``Tags``: ``create(tag, version)``, ``delete(tag)``,
``list()``, ``get_version(tag)`` and ``update(tag, version)``. The records and
what vacuum keeps for them are :mod:`beam_supertable.format.tags`; a table
that keeps Iceberg metadata shows each tag as an Iceberg tag ref.
"""

from __future__ import annotations

import logging
from typing import Dict, Union

from beam_supertable.errors import TagNotFoundError, VersionNotFoundError
from beam_supertable.format import tags as records
from beam_supertable.format.manifest import Manifest
from beam_supertable.format.store import ObjectStore

__all__ = ["Tags", "resolve"]

_LOG = logging.getLogger(__name__)


def _unknown(store: ObjectStore, name: str) -> TagNotFoundError:
    known = records.listing(store, skip_unreadable=True)
    listed = ", ".join(f"{n} (version {v})" for n, v in known.items()) or "none"
    return TagNotFoundError(f"{store.uri}: no tag named {name!r}; the table's tags: {listed}")


def resolve(store: ObjectStore, version: Union[int, str, None]) -> Union[int, None]:
    """``version`` as a version number: a tag name is looked up, an int (or None)
    passes through.

    Raises:
        TagNotFoundError: no tag of that name (the message lists the tags).
    """
    if version is None or isinstance(version, int):
        return version
    if not isinstance(version, str):
        raise VersionNotFoundError(f"{store.uri}: version must be an int or a tag name, got "
                                   f"{version!r}")
    if version.isdigit():
        return int(version)
    try:
        records.check_name(version)
    except ValueError:
        raise _unknown(store, version) from None
    at = records.recorded(store, version)
    if at is None:
        raise _unknown(store, version)
    return at


class Tags:
    """The tags of one table (``Supertable.tags``).

    Tags live beside the versions, not in them: creating or deleting one is
    no commit, and every handle on the table sees the same tags.
    """

    def __init__(self, manifest: Manifest) -> None:
        self._manifest = manifest

    @property
    def _store(self) -> ObjectStore:
        return self._manifest.store

    def __repr__(self) -> str:
        return f"Tags({self._store.uri!r}, {self.list()!r})"

    def list(self) -> Dict[str, int]:
        """Every tag, by name: name -> the version it names."""
        return records.listing(self._store)

    def get_version(self, tag: str) -> int:
        """The version ``tag`` names.

        Raises:
            TagNotFoundError: no such tag (the message lists the tags).
        """
        records.check_name(tag)
        at = records.recorded(self._store, tag)
        if at is None:
            raise _unknown(self._store, tag)
        return at

    def _check_version(self, tag: str, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"tag {tag!r}: version must be an int >= 0, got {version!r}")
        if self._manifest._try_version(version) is None:
            raise VersionNotFoundError(self._gone(tag, version))

    def _gone(self, tag: str, version: int) -> str:
        listed = self._manifest._listed_versions()
        if listed and version > listed[-1]:
            why = f"the latest is {self._manifest.latest_version()}"
        else:
            why = f"vacuumed or never written; the oldest version still readable is " \
                  f"{listed[0] if listed else None}"
        return f"{self._store.uri}: cannot tag {tag!r} on version {version}: no such " \
               f"version ({why})"

    def create(self, tag: str, version: int) -> None:
        """Names ``version`` ``tag``; vacuum keeps it until the tag is deleted.

        Of two creators of one name exactly one wins (an atomic create).

        Raises:
            ValueError: a bad tag name, or a version that is no int >= 0.
            TagExistsError: the tag exists already (a ``FileExistsError``).
            VersionNotFoundError: no such version (never written, or vacuumed).
        """
        records.check_name(tag)
        self._check_version(tag, version)
        records.create(self._store, tag, version, self._manifest.clock())
        # Recorded first, checked after: a vacuum from now on keeps the version.
        if self._manifest._try_version(version) is None:
            records.delete(self._store, tag)
            raise VersionNotFoundError(self._gone(tag, version))
        self._refresh_views()

    def update(self, tag: str, version: int) -> None:
        """Points the existing ``tag`` at ``version``.

        Raises:
            TagNotFoundError: no such tag.
            VersionNotFoundError: no such version.
        """
        self.get_version(tag)
        self._check_version(tag, version)
        records.replace(self._store, tag, version, self._manifest.clock())
        if self._manifest._try_version(version) is None:
            _LOG.warning("%s: version %d was vacuumed while tag %r moved to it",
                         self._store.uri, version, tag)
        self._refresh_views()

    def delete(self, tag: str) -> None:
        """Forgets ``tag``; the next vacuum may remove what only its version held.

        Raises:
            TagNotFoundError: no such tag (the message lists the tags).
        """
        records.check_name(tag)
        if not records.delete(self._store, tag):
            raise _unknown(self._store, tag)
        self._refresh_views()

    def _refresh_views(self) -> None:
        """The derived faces (Iceberg) of the latest version show the tags now."""
        try:
            latest = self._manifest.load()
        except Exception as exc:  # noqa: BLE001 - the tag is recorded; the faces follow later
            _LOG.warning("%s: tags changed, but the latest version could not be read (%s)",
                         self._store.uri, exc)
            return
        for view in self._manifest.views:
            refresh = getattr(view, "after_tags", None)
            if refresh is None:
                continue
            try:
                refresh(latest)
            except Exception as exc:  # noqa: BLE001 - as after_commit: say what is stale
                _LOG.warning("%s: tags changed, but the Iceberg metadata of version %d was not "
                             "rewritten (%s: %s); `beam-supertable iceberg sync` does it",
                             self._store.uri, latest.version, type(exc).__name__, exc)
