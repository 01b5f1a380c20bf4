"""``vacuum``: versions past the retention, and objects no retained version needs."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union


from beam_supertable import iceberg, ids
from beam_supertable.store import ObjectInfo
from beam_supertable._manifest_doc import (
    HINT, META, TOKENS, VERSIONS, Snapshot, version_of, version_path)
from beam_supertable._manifest_tokens import _marker_version, token_folder
DEFAULT_VACUUM_GRACE_S = 6 * 3600

_LOG = logging.getLogger(__name__)


def grace_seconds(older_than: Union[float, datetime.timedelta, None]) -> float:
    """A vacuum grace period in seconds: ``None`` is the default grace, never zero."""
    if older_than is None:
        return float(DEFAULT_VACUUM_GRACE_S)
    if isinstance(older_than, datetime.timedelta):
        older_than = older_than.total_seconds()
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or older_than < 0:
        raise ValueError(
            f"vacuum: older_than must be seconds >= 0, a timedelta or None, got {older_than!r}")
    return float(older_than)


@dataclasses.dataclass(frozen=True)
class VacuumReport:
    """What ``vacuum`` removed and kept."""

    removed_versions: Tuple[int, ...]
    removed_objects: Tuple[str, ...]
    removed_bytes: int
    retained_versions: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class VacuumPlan:
    """What a vacuum would do at one moment (``Manifest.plan_vacuum``).

    Attributes:
        removed_versions: versions it would delete.
        removed_objects: objects it would delete (versions included), by path.
        retained_versions: versions it keeps (the newest ``retain_versions``
            and any younger than the grace period).
        waiting_objects: objects no kept version references that the grace
            period still protects (a commit in flight, or an orphan that is
            reclaimable later).
        grace_s: the grace period applied, in seconds.
    """

    removed_versions: Tuple[int, ...]
    removed_objects: Tuple[ObjectInfo, ...]
    retained_versions: Tuple[int, ...]
    waiting_objects: Tuple[ObjectInfo, ...]
    grace_s: float

    @property
    def removed_bytes(self) -> int:
        return sum(i.size for i in self.removed_objects)

    @property
    def waiting_bytes(self) -> int:
        return sum(i.size for i in self.waiting_objects)

    def report(self) -> VacuumReport:
        """The plan as what ``vacuum`` returns."""
        return VacuumReport(self.removed_versions, tuple(i.path for i in self.removed_objects),
                            self.removed_bytes, self.retained_versions)


class Vacuum:
    """``vacuum``: reclaims what no retained version needs.

    Mixed into :class:`~beam_supertable.manifest.Manifest`; uses its ``store``,
    version listing and part reader.
    """

    # -- maintenance -----------------------------------------------------
    def referenced(self, snapshot: Snapshot) -> set:
        """Every object path a version needs."""
        refs = {version_path(snapshot.version)}
        if isinstance(snapshot.commit.get("part"), str):
            refs.add(snapshot.commit["part"])   # the commit's own entries (the change feed's)
        for part in snapshot.parts:
            refs.add(part.path)
            for entry in self.read_part(part.path):
                refs.add(entry["path"])
                refs.update(entry.get("extra_paths", ()))
        for paths in snapshot.deletes.values():
            refs.update(paths)
        for value in snapshot.properties.values():
            if isinstance(value, dict) and isinstance(value.get("path"), str):
                refs.add(value["path"])
        return refs

    def iceberg_referenced(self, snapshot: Snapshot) -> set:
        """The Iceberg objects a version's metadata needs (some may not be written yet:
        they are derived, and written again when missing)."""
        return iceberg.referenced(self.store, snapshot) if iceberg.is_enabled(snapshot) \
            else set()

    def plan_vacuum(self, *, retain_versions: int = 10,
                    older_than: Union[float, datetime.timedelta, None] = None,
                    objects: Optional[Sequence[ObjectInfo]] = None,
                    now: Optional[float] = None) -> "VacuumPlan":
        """What ``vacuum`` would delete now, without deleting or writing anything.

        Reads the version documents and manifest parts of the versions it
        keeps and lists the table; never reads superfile data.

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period, as for ``vacuum``.
            objects: the table's listing (``store.list("")``), when the caller
                already has one; listed here otherwise.
            now: the time objects' ages are measured at (default: now).

        Returns:
            The plan: versions and objects to remove, versions kept, and the
            unreferenced objects the grace period still protects.
        """
        if isinstance(retain_versions, bool) or not isinstance(retain_versions, int) \
                or retain_versions < 1:
            raise ValueError(
                f"vacuum: retain_versions must be an int >= 1, got {retain_versions!r}")
        grace = grace_seconds(older_than)
        latest = self.latest_version()
        now = time.time() if now is None else now
        objects = self.store.list("") if objects is None else objects
        version_infos = {version_of(i.path): i for i in objects if version_of(i.path) is not None}
        ordered = sorted(v for v in version_infos if v <= latest)
        keep = set(ordered[-retain_versions:])
        for v in ordered:
            mtime = version_infos[v].mtime
            if mtime is None or now - mtime < grace:
                keep.add(v)
        keep.update(v for v in version_infos if v > latest)
        referenced = {HINT}
        for v in sorted(keep):
            doc = self._try_version(v)
            if doc is not None:
                kept = self._snapshot(doc)
                referenced |= self.referenced(kept) | self.iceberg_referenced(kept)
        removed: List[ObjectInfo] = []
        waiting: List[ObjectInfo] = []
        removed_versions = []
        for info in objects:
            path = info.path
            if path in referenced or path.startswith((ids.CLAIMS + "/", TOKENS + "/")):
                # Id claims are kept forever (their ids may be in use), token
                # markers too (a rerun of a vacuumed commit is refused by them).
                continue
            if path.startswith(VERSIONS + "/"):
                version = version_of(path)
                if version is None:
                    continue
            elif not (path.startswith(("data/", "deletes/", f"{META}/")) or
                      iceberg.is_ours(path) or path.rsplit("/", 1)[-1].startswith(".tmp-")):
                continue  # not ours: leave objects we did not write alone
            else:
                version = None
            if info.mtime is None or now - info.mtime < grace:
                waiting.append(info)
                continue
            if version is not None:
                removed_versions.append(version)
            removed.append(info)
        removed += self._stale_markers(objects, removed_versions)
        return VacuumPlan(tuple(sorted(removed_versions)),
                          tuple(sorted(removed, key=lambda i: i.path)),
                          tuple(sorted(keep)), tuple(sorted(waiting, key=lambda i: i.path)),
                          grace)

    def _stale_markers(self, objects: Sequence[ObjectInfo],
                       removed_versions: Sequence[int]) -> List[ObjectInfo]:
        """Token markers of versions about to go that another token's commit holds.

        Such a marker's attempt lost its race; once its version is gone
        nothing could tell so, and the token would be refused for good. One
        read per removed version that markers name (normally none).
        """
        going = set(removed_versions)
        named: Dict[int, List[ObjectInfo]] = {}
        for info in objects:
            if info.path.startswith(TOKENS + "/"):
                version = _marker_version(info.path)
                if version in going:
                    named.setdefault(version, []).append(info)
        stale = []
        for version, markers in named.items():
            doc = self._try_version(version)
            if doc is None:
                continue  # already gone: whether a marker landed cannot be told
            token = doc.get("commit", {}).get("token")
            held = token_folder(token) + "/" if token is not None else None
            stale += [m for m in markers if held is None or not m.path.startswith(held)]
        return stale

    def vacuum(self, *, retain_versions: int = 10,
               older_than: Union[float, datetime.timedelta, None] = None,
               dry_run: bool = False) -> VacuumReport:
        """Deletes what no retained version references, once past the grace period.

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period in seconds (or a ``timedelta``): objects
                and versions younger than this are kept whatever references
                them, so a commit in flight never loses its files. ``None``
                (the default) means ``DEFAULT_VACUUM_GRACE_S`` (6 hours); ``0``
                means no grace.
            dry_run: report without deleting (``plan_vacuum`` says more).
        """
        plan = self.plan_vacuum(retain_versions=retain_versions, older_than=older_than)
        self.store.check_writable()
        if not dry_run:
            # Versions first (oldest first), then what only they referenced: a
            # vacuum cut short leaves orphans, never a listed version whose
            # parts or data are gone. Kept versions reference nothing removed.
            # Stale token markers go before the versions that show them stale.
            for info in sorted(plan.removed_objects,
                               key=lambda i: (not i.path.startswith(TOKENS),
                                              not i.path.startswith(VERSIONS), i.path)):
                self.store.delete(info.path)
            if plan.removed_versions:
                latest = self.load()
                if iceberg.is_enabled(latest):
                    self.iceberg.prune_history(latest, list(plan.retained_versions))
        return plan.report()
