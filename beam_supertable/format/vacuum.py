"""``vacuum``: versions past the retention, and objects no retained version needs."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

from beam_supertable.format import consumers as named, ids, tags as tagged
from beam_supertable.format.consumers import CONSUMERS, Consumer
from beam_supertable.format.documents import (
    HINT, META, TOKEN_INDEX, TOKENS, VERSIONS, Snapshot, epoch_of, iso_of, retention_seconds,
    token_retention_of, unseal, version_of, version_path)
from beam_supertable.format.store import ObjectInfo
from beam_supertable.format.tags import TAGS
from beam_supertable.format.tokens import (
    _marker_version, index_period_s, index_range, token_folder, token_hash)

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
    folded_tokens: int = 0              # markers folded into the token index
    # Tokens of commits before it are forgotten (a moment, so not compared).
    token_horizon: Optional[str] = dataclasses.field(default=None, compare=False)
    # The change feed's named consumers (ages move, so not compared), the versions
    # kept only because a live one or a tag still needs them, and the bytes only those hold.
    consumers: Tuple[Consumer, ...] = dataclasses.field(default=(), compare=False)
    held_versions: Tuple[int, ...] = ()
    held_bytes: int = 0
    # The table's tags (name -> version): each tagged version is kept.
    tags: Dict[str, int] = dataclasses.field(default_factory=dict, compare=False)


@dataclasses.dataclass(frozen=True)
class VacuumPlan:
    """What a vacuum would do at one moment (``Manifest.plan_vacuum``).

    Attributes:
        removed_versions: versions it would delete.
        removed_objects: objects it would delete (versions included), by path.
        retained_versions: versions it keeps (the newest ``retain_versions``,
            any younger than the grace period, those a live consumer
            still needs, and tagged ones).
        waiting_objects: objects no kept version references that the grace
            period still protects (a commit in flight, or an orphan that is
            reclaimable later).
        grace_s: the grace period applied, in seconds.
        token_retention_s: the token retention applied, in seconds.
        token_horizon: ``now - token_retention_s`` (epoch seconds): markers
            and index objects of commits before it are removed.
        folds: index entries to write, by period ``(start, end)``: the
            markers of removed versions whose tokens are still remembered.
        consumers: the change feed's named consumers, aged at the plan's moment.
        held_versions: versions kept only because a live consumer or a tag
            needs them.
        held_bytes: the bytes of the objects only those versions reference.
        tags: the table's tags (name -> version); every tagged version is kept.
        tag_held_versions: versions kept only because a tag names them (and no
            live consumer needs them).
        tag_held_bytes: the bytes of the objects only those versions reference.
    """

    removed_versions: Tuple[int, ...]
    removed_objects: Tuple[ObjectInfo, ...]
    retained_versions: Tuple[int, ...]
    waiting_objects: Tuple[ObjectInfo, ...]
    grace_s: float
    token_retention_s: float = 0.0
    token_horizon: float = 0.0
    folds: Dict[Tuple[int, int], List[list]] = dataclasses.field(default_factory=dict)
    consumers: Tuple[Consumer, ...] = ()
    held_versions: Tuple[int, ...] = ()
    held_bytes: int = 0
    tags: Dict[str, int] = dataclasses.field(default_factory=dict)
    tag_held_versions: Tuple[int, ...] = ()
    tag_held_bytes: int = 0

    @property
    def folded_tokens(self) -> int:
        return sum(len(v) for v in self.folds.values())

    @property
    def removed_bytes(self) -> int:
        return sum(i.size for i in self.removed_objects)

    @property
    def waiting_bytes(self) -> int:
        return sum(i.size for i in self.waiting_objects)

    def report(self) -> VacuumReport:
        """The plan as what ``vacuum`` returns."""
        return VacuumReport(self.removed_versions, tuple(i.path for i in self.removed_objects),
                            self.removed_bytes, self.retained_versions, self.folded_tokens,
                            iso_of(self.token_horizon), self.consumers, self.held_versions,
                            self.held_bytes, dict(self.tags))


class Vacuum:
    """``vacuum``: reclaims what no retained version needs.

    Mixed into :class:`~beam_supertable.format.manifest.Manifest`; uses its ``store``,
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

    def derived_referenced(self, snapshot: Snapshot) -> set:
        """The objects the derived faces (the Iceberg metadata) need for a version
        (some may not be written yet: they are derived, and written again when missing)."""
        return set().union(*(view.needed_by(snapshot) for view in self.views))

    def plan_vacuum(self, *, retain_versions: int = 10,
                    older_than: Union[float, datetime.timedelta, None] = None,
                    objects: Optional[Sequence[ObjectInfo]] = None,
                    now: Optional[float] = None,
                    token_retention: Union[float, datetime.timedelta, None] = None,
                    keep_versions: Sequence[int] = ()) -> "VacuumPlan":
        """What ``vacuum`` would delete now, without deleting or writing anything.

        Reads the version documents and manifest parts of the versions it
        keeps and lists the table; never reads superfile data.

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period, as for ``vacuum``.
            objects: the table's listing (``store.list("")``), when the caller
                already has one; listed here otherwise.
            now: the time objects' ages are measured at (default: the
                manifest's clock).
            token_retention: how long tokens are remembered (seconds or a
                ``timedelta``); default: the latest version's ``token_retention``.
            keep_versions: versions kept whatever their age (e.g. the version
                a streaming upsert run started on and reads its priors at).

        Every version from the oldest live consumer's on is kept (see
        :mod:`beam_supertable.format.consumers`), and every tagged version
        (:mod:`beam_supertable.format.tags`).

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
        now = self.clock() if now is None else now
        if objects is None:
            for view in self.views:
                # What this process is still writing is listed whole (a face
                # that writes nothing beside the commit need not say so).
                getattr(view, "settle", lambda: None)()
            objects = self.store.list("")
        version_infos = {version_of(i.path): i for i in objects if version_of(i.path) is not None}
        ordered = sorted(v for v in version_infos if v <= latest)
        keep = set(ordered[-retain_versions:])
        for v in ordered:
            mtime = version_infos[v].mtime
            if mtime is None or now - mtime < grace:
                keep.add(v)
        keep.update(v for v in version_infos if v > latest)
        keep.update(v for v in keep_versions if v in version_infos)
        latest_doc = self._try_version(latest)
        properties = latest_doc.get("properties", {}) if latest_doc is not None else {}
        consumers = tuple(named.listing(self.store, now, named.consumer_expiry_of(properties),
                                        objects, skip_unreadable=True))
        floor = named.held_from(consumers, ordered)
        held = {v for v in ordered if floor is not None and v >= floor} - keep
        tags = tagged.listing(self.store, objects, skip_unreadable=True)
        tag_held = {v for v in tags.values() if v in version_infos and v <= latest} - keep - held
        held |= tag_held
        keep |= held
        referenced = {HINT}
        only_held: set = set()
        tag_refs: set = set()     # what the versions only tags hold reference
        other_held_refs: set = set()
        kept_at: Dict[int, Optional[float]] = {}
        retention = None if token_retention is None else retention_seconds(token_retention)
        for v in sorted(keep):
            doc = latest_doc if v == latest else self._try_version(v)
            if doc is not None:
                kept = self._snapshot(doc)
                refs = self.referenced(kept) | self.derived_referenced(kept)
                (only_held if v in held else referenced).update(refs)
                if v in held:
                    (tag_refs if v in tag_held else other_held_refs).update(refs)
                kept_at[v] = epoch_of(kept.commit.get("timestamp"))
                if v == latest and retention is None:
                    retention = token_retention_of(kept.properties)
        only_held -= referenced
        held_bytes = sum(i.size for i in objects if i.path in only_held)
        # Bytes only tags hold: not referenced by a version kept for another reason.
        tag_refs -= referenced | other_held_refs
        tag_bytes = sum(i.size for i in objects if i.path in tag_refs)
        referenced |= only_held
        retention = token_retention_of({}) if retention is None else retention
        horizon = now - retention
        removed: List[ObjectInfo] = []
        waiting: List[ObjectInfo] = []
        removed_versions = []
        for info in objects:
            path = info.path
            if path in referenced or path.startswith((ids.CLAIMS + "/", TOKENS + "/",
                                                      CONSUMERS + "/", TAGS + "/")):
                # Id claims are kept (their ids may be in use), consumers and
                # tags until dropped; token markers and index objects go by the token
                # horizon, below.
                continue
            if path.startswith(VERSIONS + "/"):
                version = version_of(path)
                if version is None:
                    continue
            elif not (path.startswith(("data/", "deletes/", f"{META}/")) or
                      any(view.owns(path) for view in self.views) or path.rsplit("/", 1)[-1].startswith(".tmp-")):
                continue  # not ours: leave objects we did not write alone
            else:
                version = None
            if info.mtime is None or now - info.mtime < grace:
                waiting.append(info)
                continue
            if version is not None:
                removed_versions.append(version)
            removed.append(info)
        gone, folds = self._past_tokens(objects, removed_versions, kept_at, horizon,
                                        index_period_s(retention))
        removed += gone
        return VacuumPlan(tuple(sorted(removed_versions)),
                          tuple(sorted(removed, key=lambda i: i.path)),
                          tuple(sorted(keep)), tuple(sorted(waiting, key=lambda i: i.path)),
                          grace, retention, horizon, folds, consumers, tuple(sorted(held)),
                          held_bytes, tags, tuple(sorted(tag_held)), tag_bytes)

    def _needs_replan(self, plan: "VacuumPlan") -> bool:
        """Whether a consumer recorded or a tag created since ``plan`` was made needs a
        version it removes."""
        going = set(plan.removed_versions)
        if any(v in going for v in tagged.listing(self.store, skip_unreadable=True).values()):
            return True
        seen = {(c.name, c.version) for c in plan.consumers if not c.expired}
        latest = self._try_version(self.latest_version()) or {}
        fresh = named.listing(self.store, self.clock(),
                              named.consumer_expiry_of(latest.get("properties", {})),
                              skip_unreadable=True)
        # A consumer that registered, moved back or came back to life (an expired
        # one that recorded again) since the plan.
        return any(not c.expired and (c.name, c.version) not in seen
                   and c.version <= max(plan.removed_versions) for c in fresh)

    def _past_tokens(self, objects: Sequence[ObjectInfo], removed_versions: Sequence[int],
                     kept_at: Dict[int, Optional[float]], horizon: float, period: float
                     ) -> Tuple[List[ObjectInfo], Dict[Tuple[int, int], List[list]]]:
        """Token objects to remove, and index entries to write in their place.

        A marker goes when its commit is past the horizon (by the version's
        timestamp; by the marker's own age when its version is gone or not
        created yet), or when its version goes: then, if that version holds
        the marker's token and is still within the horizon, the token is
        folded into the index entry of its period. A marker whose version
        holds another commit lost its race and just goes. One read per
        removed version that markers name (normally one per tokened commit).
        """
        going = set(removed_versions)
        named: Dict[int, List[ObjectInfo]] = {}
        gone: List[ObjectInfo] = []
        folds: Dict[Tuple[int, int], List[list]] = {}
        for info in objects:
            if not info.path.startswith(TOKENS + "/"):
                continue
            span = index_range(info.path)
            if info.path.startswith(TOKEN_INDEX + "/"):
                if span is not None and span[1] < horizon:
                    gone.append(info)   # every entry is past the horizon
                continue
            version = _marker_version(info.path)
            if version is None:
                continue
            if version in going:
                named.setdefault(version, []).append(info)
            elif version in kept_at:
                at = kept_at[version]
                if at is not None and at < horizon:
                    gone.append(info)
            elif info.mtime is not None and info.mtime < horizon:
                gone.append(info)
        for version, markers in sorted(named.items()):
            doc = self._try_version(version)
            if doc is None:
                continue  # already gone: whether a marker landed cannot be told
            commit = doc.get("commit", {})
            token = commit.get("token")
            held = token_folder(token) + "/" if token is not None else None
            at = epoch_of(commit.get("timestamp"))
            for marker in markers:
                gone.append(marker)
                if held is None or not marker.path.startswith(held) or at is None \
                        or at < horizon:
                    continue
                fp = commit.get("fingerprint") or {}
                # Whole seconds that still hold ``at``: an end rounded below it
                # would drop the entry before its horizon.
                step = math.floor(at / period)
                start, end = math.floor(step * period), math.ceil((step + 1) * period)
                folds.setdefault((start, max(end, math.floor(at) + 1)), []).append(
                    [token_hash(token), version, at, fp.get("sha256"), fp.get("rows"),
                     fp.get("superfiles")])
        return gone, folds

    def _write_folds(self, folds: Dict[Tuple[int, int], List[list]]) -> List[str]:
        """Writes the index objects of ``folds``, each merged with the index objects
        of the same period already there; returns those it replaces (to delete
        after the markers, so a lookup always finds a token in one or the other)."""
        if not folds:
            return []
        listed: Dict[Tuple[int, int], List[str]] = {}
        for info in self.store.list(TOKEN_INDEX):
            span = index_range(info.path)
            if span is not None and span in folds:
                listed.setdefault(span, []).append(info.path)
        replaced = []
        for (start, end), entries in sorted(folds.items()):
            merged = {tuple(e) for e in entries}
            for path in listed.get((start, end), []):
                try:
                    doc = unseal(self.store.get(path), f"{self.store.uri}/{path}")
                except FileNotFoundError:
                    continue   # replaced by a concurrent vacuum: its successor is listed
                merged.update(tuple(e) for e in doc["entries"])
            path = self.write_token_index(start, end, [list(e) for e in merged])
            replaced += [p for p in listed.get((start, end), []) if p != path]
        return replaced

    def vacuum(self, *, retain_versions: int = 10,
               older_than: Union[float, datetime.timedelta, None] = None,
               dry_run: bool = False,
               token_retention: Union[float, datetime.timedelta, None] = None,
               keep_versions: Sequence[int] = ()) -> VacuumReport:
        """Deletes what no retained version references, once past the grace period,
        and token markers and index objects past the token horizon.

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period in seconds (or a ``timedelta``): objects
                and versions younger than this are kept whatever references
                them, so a commit in flight never loses its files. ``None``
                (the default) means ``DEFAULT_VACUUM_GRACE_S`` (6 hours); ``0``
                means no grace.
            dry_run: report without deleting (``plan_vacuum`` says more).
            token_retention: how long tokens are remembered (seconds or a
                ``timedelta``); default: the table's ``token_retention``.
            keep_versions: versions kept whatever their age (``plan_vacuum``).

        A live consumer of the change feed keeps every version from its own on,
        and a tag its version; one that registers or moves back, or a tag
        created, while the plan is made is seen by a second look just before
        anything is deleted.
        """
        plan = self.plan_vacuum(retain_versions=retain_versions, older_than=older_than,
                                token_retention=token_retention, keep_versions=keep_versions)
        if not dry_run and plan.removed_versions and self._needs_replan(plan):
            plan = self.plan_vacuum(retain_versions=retain_versions, older_than=older_than,
                                    token_retention=token_retention,
                                    keep_versions=keep_versions)
        self.store.check_writable()
        if not dry_run:
            # The index first: a marker goes only once its token is folded.
            replaced = self._write_folds(plan.folds)
            # Versions first (oldest first), then what only they referenced: a
            # vacuum cut short leaves orphans, never a listed version whose
            # parts or data are gone. Kept versions reference nothing removed.
            # Stale token markers go before the versions that show them stale.
            for info in sorted(plan.removed_objects,
                               key=lambda i: (not i.path.startswith(TOKENS),
                                              not i.path.startswith(VERSIONS), i.path)):
                self.store.delete(info.path)
            for path in replaced:
                self.store.delete(path)
            # Every time, not only when this vacuum removed versions: a view written
            # while an earlier vacuum ran may still name versions that one removed.
            latest = self.load()
            kept = set(plan.retained_versions)
            # and the versions committed since the plan was made
            kept.update(range(max(kept, default=latest.version) + 1, latest.version + 1))
            for view in self.views:
                view.after_vacuum(latest, sorted(kept))
        return plan.report()
