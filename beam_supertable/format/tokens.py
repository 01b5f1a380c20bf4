"""Idempotency tokens: the markers a tokened commit leaves, and how it finds itself.

Before creating version N a tokened commit creates
``_supertable/tokens/<sha256(token)>/<N:020d>.json`` (JSON ``{"token", "version",
"timestamp"}``), so one listing of the token's folder names every
version its commits tried.

A token is remembered for the table's ``token_retention`` after the commit that
carried it (its recorded timestamp): a rerun within it is recognised, a rerun
after it is a new commit. ``vacuum`` folds the markers of the versions it
removes into one sorted, immutable index object per period,
``_supertable/tokens/index/<start>-<end>-<digest>.json`` (entries
``[sha256(token), version, timestamp, fingerprint sha256, rows, superfiles]``
sorted by hash), and removes markers and index objects past the horizon."""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from beam_supertable.errors import AlreadyExists, TokenReuseError
from beam_supertable.format.documents import (
    FORMAT_VERSION, RECENT_TOKENS, TOKEN_INDEX, TOKENS, VERSION_DIGITS, CommitRequest, Snapshot,
    epoch_of, seal, token_retention_of, unseal)

_LOG = logging.getLogger(__name__)

INDEX_PERIODS = 8          # index objects a retention spans (one per period)
MIN_INDEX_PERIOD_S = 60.0
INDEX_CACHE_OBJECTS = 32   # index objects a process keeps decoded (LRU)
_INDEX_CACHE: "OrderedDict[Tuple[str, str], List[list]]" = OrderedDict()
_INDEX_LOCK = threading.Lock()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode('utf-8')).hexdigest()


def token_folder(token: str) -> str:
    """Where the markers of ``token`` live (one folder per token)."""
    return f"{TOKENS}/{token_hash(token)}"


def token_marker_path(token: str, version: int) -> str:
    """The marker a commit with ``token`` leaves before it creates ``version``."""
    return f"{token_folder(token)}/{version:0{VERSION_DIGITS}d}.json"


def _marker_version(path: str) -> Optional[int]:
    if path.startswith(TOKEN_INDEX + "/"):
        return None
    name = path.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


def index_period_s(retention_s: float) -> float:
    """How long a period of the token index covers: an eighth of the retention."""
    return max(MIN_INDEX_PERIOD_S, retention_s / INDEX_PERIODS)


def index_path(start: int, end: int, entries: List[list]) -> str:
    digest = hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()
    return f"{TOKEN_INDEX}/{start:012d}-{end:012d}-{digest[:16]}.json"


def index_range(path: str) -> Optional[Tuple[int, int]]:
    """``(start, end)`` (epoch seconds) of an index object's period, from its name."""
    if not path.startswith(TOKEN_INDEX + "/"):
        return None
    fields = path.rsplit("/", 1)[-1].split("-")
    if len(fields) != 3 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


class IndexedToken(NamedTuple):
    """A token found in the index: its version was vacuumed, its commit is known."""

    version: int
    timestamp: float
    fingerprint: Optional[str]
    rows: Optional[int]
    superfiles: Optional[int]


class TokenIndex:
    """The token markers of a table: where a tokened commit looks for itself.

    Mixed into :class:`~beam_supertable.format.manifest.Manifest`; uses its ``store``,
    ``clock``, ``_try_version`` and ``_snapshot``.
    """

    def token_horizon(self, base: Snapshot) -> float:
        """Commits before this moment (epoch seconds) have had their tokens forgotten."""
        return self.clock() - token_retention_of(base.properties)

    def _remembered(self, doc: Dict[str, Any], horizon: float) -> Optional[Snapshot]:
        """The version ``doc`` holding the token, unless its commit is past the horizon."""
        at = epoch_of(doc.get("commit", {}).get("timestamp"))
        if at is not None and at < horizon:
            return None
        return self._snapshot(doc)

    def _find_token(self, token: str, base: Snapshot, since: Optional[int],
                    window: int = RECENT_TOKENS):
        """Where ``token`` landed at or below ``base`` within its retention, else None:
        a Snapshot, or an ``IndexedToken`` when its version was vacuumed.

        ``window`` is how many tokens each version carries (the committer's
        ``RECENT_TOKENS``): past it the token is looked for by its markers.
        """
        horizon = self.token_horizon(base)
        if token in base.recent_tokens:
            # The recent window says it landed at or before base; find which.
            version = base.version
            while version >= 0:
                doc = self._try_version(version)
                if doc is None:
                    break
                if doc.get("commit", {}).get("token") == token:
                    return self._remembered(doc, horizon)
                version -= 1
            # Its version was vacuumed: its marker or the index may still know it.
            return self._find_token_marker(token, base, horizon)
        if since is not None and since <= base.version - window:
            # ``since`` itself may hold the token (a handle standing on its own commit).
            for version in range(base.version - window, since - 1, -1):
                doc = self._try_version(version)
                if doc is not None and doc.get("commit", {}).get("token") == token:
                    return self._remembered(doc, horizon)
        return self._find_token_marker(token, base, horizon)

    def _find_token_marker(self, token: str, base: Snapshot, horizon: float):
        """The version at or below ``base`` holding ``token``, by its markers, then
        by the index of folded markers.

        One listing of the token's folder plus one read per version a commit
        with the token tried (normally none or one), then one listing of the
        index (its objects are immutable: each is read once per handle): the
        cost does not grow with the table's history. A marker above ``base``
        belongs to an attempt this base cannot show yet; the next round's
        base will. Vacuum writes the index before it removes markers, so
        listing the markers first never misses a token between the two.
        """
        markers = []
        for info in self.store.list(token_folder(token)):
            version = _marker_version(info.path)
            if version is not None and version <= base.version:
                markers.append((version, info))
        for version, info in sorted(markers, key=lambda m: m[0], reverse=True):
            doc = self._try_version(version)
            if doc is None:
                folded = self._indexed(token, horizon)
                if folded is not None:
                    return folded
                if info.mtime is not None and info.mtime < horizon:
                    continue   # written before the horizon: whatever it was is forgotten
                raise TokenReuseError(
                    f"{self.store.uri}: a commit with token {token!r} tried version {version}, "
                    f"which has since been vacuumed, so whether the token landed there "
                    f"cannot be told and this commit on version {base.version} cannot be "
                    f"checked against it; use a fresh token",
                    token=token, landed_version=None, base_version=base.version)
            if doc.get("commit", {}).get("token") == token:
                return self._remembered(doc, horizon)
            # Another commit holds that version: the marker's attempt lost its
            # race for good (versions are immutable), so it can go.
            self._drop_marker(info.path)
        return self._indexed(token, horizon)

    # -- the index of folded markers ---------------------------------------
    def _indexed(self, token: str, horizon: float) -> Optional[IndexedToken]:
        """The newest index entry of ``token`` within the horizon, else None."""
        key = token_hash(token)
        best, read, relist = None, set(), True
        while relist:
            relist = False
            for info in self.store.list(TOKEN_INDEX):
                span = index_range(info.path)
                if span is None or span[1] < horizon or info.path in read:
                    continue
                read.add(info.path)   # once each, even if a stale listing still shows it
                entries = self._index_entries(info.path)
                if entries is None:
                    # Merged into a successor written before this one went, but
                    # perhaps after the listing: list again to find it.
                    relist = True
                    continue
                best = self._best_entry(entries, key, horizon, best)
        return best

    @staticmethod
    def _best_entry(entries: List[list], key: str, horizon: float,
                    best: Optional[IndexedToken]) -> Optional[IndexedToken]:
        at = bisect.bisect_left(entries, [key])
        while at < len(entries) and entries[at][0] == key:
            entry = entries[at]
            if entry[2] >= horizon and (best is None or entry[1] > best.version):
                best = IndexedToken(*entry[1:6])
            at += 1
        return best

    def _index_entries(self, path: str) -> Optional[List[list]]:
        # Index objects never change: one cache for the process, so writers that
        # open a fresh handle per commit (the Beam commit steps) read each once.
        key = (self.store.uri, path)
        with _INDEX_LOCK:
            cached = _INDEX_CACHE.get(key)
            if cached is not None:
                _INDEX_CACHE.move_to_end(key)
                return cached
        try:
            doc = unseal(self.store.get(path), f"{self.store.uri}/{path}")
        except FileNotFoundError:
            return None   # replaced by a merged object meanwhile
        with _INDEX_LOCK:
            _INDEX_CACHE[key] = doc["entries"]
            while len(_INDEX_CACHE) > INDEX_CACHE_OBJECTS:
                _INDEX_CACHE.popitem(last=False)
        return doc["entries"]

    def write_token_index(self, start: int, end: int, entries: List[list]) -> str:
        """Writes one index object (idempotent: its name is its content's digest)."""
        entries = sorted(entries)
        path = index_path(start, end, entries)
        try:
            self.store.put_if_absent(path, seal({
                "format_version": FORMAT_VERSION, "start": start, "end": end,
                "entries": entries}))
        except AlreadyExists:
            pass
        return path

    # -- marking -------------------------------------------------------------
    def _mark_token(self, token: str, version: int,
                    commit: Optional[Dict[str, Any]] = None) -> None:
        """Leaves the token's marker for ``version`` (before creating it)."""
        body: Dict[str, Any] = {"token": token, "version": version}
        if commit is not None:
            body["timestamp"] = commit.get("timestamp")
        try:
            self.store.put_if_absent(token_marker_path(token, version),
                                     json.dumps(body, sort_keys=True).encode())
        except AlreadyExists:
            pass  # the same token tried this version before (a retry): one marker does

    def _drop_marker(self, path: str) -> None:
        # Best effort: a stale marker costs a read of its version, never correctness.
        try:
            self.store.delete(path)
        except Exception as exc:  # noqa: BLE001 - the marker is only a hint
            _LOG.info("%s: could not remove stale token marker %s: %s",
                      self.store.uri, path, exc)

    def _landed(self, req: CommitRequest, fingerprint: Dict[str, Any], landed,
                base: Snapshot, attempted: Dict[int, Dict[str, Any]]) -> Snapshot:
        """The result of a commit whose token is already in ``landed`` (a Snapshot,
        or an ``IndexedToken`` of a vacuumed version: then the latest version,
        which holds its rows unless later commits removed them, is returned)."""
        if isinstance(landed, IndexedToken):
            recorded = {"sha256": landed.fingerprint, "rows": landed.rows,
                        "superfiles": landed.superfiles} if landed.fingerprint else None
            result = base
        else:
            if attempted.get(landed.version) == landed.commit:
                # This call's own create landed though it reported a failure.
                self._write_hint(landed.version)
                return landed
            recorded = landed.commit.get("fingerprint") \
                if landed.commit.get("token") == req.token else None
            result = landed
        if recorded is not None and recorded.get("sha256") != fingerprint["sha256"]:
            raise TokenReuseError(
                f"{self.store.uri}: token {req.token!r} already landed at version "
                f"{landed.version} with a different commit ({recorded.get('rows')} rows in "
                f"{recorded.get('superfiles')} superfiles, fingerprint "
                f"{str(recorded.get('sha256'))[:12]}…); this commit on version {base.version} "
                f"adds {fingerprint['rows']} rows in {fingerprint['superfiles']} superfiles "
                f"(fingerprint {fingerprint['sha256'][:12]}…). A token names one commit: "
                "use a fresh token (job_id) for new data",
                token=req.token, landed_version=landed.version, base_version=base.version)
        _LOG.warning("%s: commit token %s already landed at version %d%s; nothing committed",
                     self.store.uri, req.token, landed.version,
                     "" if recorded is not None else " (its fingerprint was not recorded, so "
                     "it cannot be checked against this commit)")
        return dataclasses.replace(result, deduplicated=True)
