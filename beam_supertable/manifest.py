"""Table versions and the optimistic-concurrency commit.

Layout under the table root::

    _supertable/versions/<N:020d>.json   version N; creating it IS the commit
    _supertable/parts/<uuid>.json        manifest parts: superfile entries, immutable
    _supertable/latest.json              hint: a recent version number (may lag)
    _supertable/tokens/<sha256(token)>/<N:020d>.json
                                         token marker: a commit with this token
                                         tried to create version N (JSON, kept)

A version document is JSON holding the format version, the Arrow schema
(IPC bytes, base64), table properties, the list of manifest parts, deletion
vectors per superfile, running totals and the commit info (timestamp,
operation, writer, idempotency token and the commit's fingerprint, user
metadata such as a source frontier). Every document carries the SHA-256 of
its canonical JSON and is checked against it when read.

Idempotency: a commit with a token that already landed is the same commit
only if its fingerprint (``commit_fingerprint``) matches the one recorded
with the token; then the landed version is returned (``deduplicated``),
otherwise :class:`TokenReuseError` is raised. A token is looked for in the
base's ``recent_tokens`` (the last ``RECENT_TOKENS``) and, past that window,
through its markers: before creating version N a tokened commit creates the
marker ``tokens/<sha256(token)>/<N>.json``, so one listing of the token's
folder names every version its commits tried, and reading those versions
(normally one) tells where it landed. The version, not the marker, is the
truth: a marker whose version holds another commit lost its race. Markers
are never vacuumed, so a token whose version was vacuumed is refused, not
committed again.

Commit cost does not grow with the table: a commit writes one new part with
its own entries and references the base's parts unchanged; parts are merged
eight at a time (a base-8 counter), so a table of ``n`` superfiles has
``O(log n)`` parts and a commit rewrites nothing in 7 of 8 cases.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import errno
import hashlib
import json
import logging
import os
import random
import socket
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import pyarrow as pa

from beam_supertable import ids
from beam_supertable.digest import combine
from beam_supertable.errors import (
    AlreadyExists, CommitConflictError, CommitFailedError, CorruptManifestError,
    NotATableError, SchemaMismatchError, StoreIOError, SupertableError, TableExistsError, TokenReuseError,
    VersionNotFoundError)
from beam_supertable.store import ObjectInfo, ObjectStore

__all__ = [
    "CommitRequest", "Manifest", "PartRef", "Snapshot", "VacuumPlan", "VacuumReport",
    "backoff_seconds", "commit_fingerprint",
]

_LOG = logging.getLogger(__name__)

FORMAT_VERSION = 1
META = "_supertable"
VERSIONS = f"{META}/versions"
PARTS = f"{META}/parts"
TOKENS = f"{META}/tokens"
HINT = f"{META}/latest.json"
VERSION_DIGITS = 20

DEFAULT_MAX_RETRIES = 10
BACKOFF_BASE_S = 0.010
BACKOFF_CAP_S = 1.0
BACKOFF_JITTER = 0.30
PART_FANOUT = 8
RECENT_TOKENS = 128          # tokens of the latest commits, carried by each version
DEFAULT_VACUUM_GRACE_S = 6 * 3600


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


def version_path(version: int) -> str:
    return f"{VERSIONS}/{version:0{VERSION_DIGITS}d}.json"


def version_of(path: str) -> Optional[int]:
    """The version number of a ``versions/<N>.json`` path, else None."""
    if not path.startswith(VERSIONS + "/"):
        return None
    name = path.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


def token_folder(token: str) -> str:
    """Where the markers of ``token`` live (one folder per token)."""
    return f"{TOKENS}/{hashlib.sha256(token.encode('utf-8')).hexdigest()}"


def token_marker_path(token: str, version: int) -> str:
    """The marker a commit with ``token`` leaves before it creates ``version``."""
    return f"{token_folder(token)}/{version:0{VERSION_DIGITS}d}.json"


def _marker_version(path: str) -> Optional[int]:
    name = path.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


def backoff_seconds(attempt: int, rng: random.Random = random) -> float:
    """10 ms × 2^attempt, at most 1 s, ±30% jitter."""
    base = min(BACKOFF_BASE_S * (2 ** attempt), BACKOFF_CAP_S)
    return base * (1 + rng.uniform(-BACKOFF_JITTER, BACKOFF_JITTER))


# Entry fields that say where and under which ids rows were written, not what
# they are: a rerun writes the same rows under new names and new ids.
_PLACEMENT_FIELDS = frozenset(
    {"id", "path", "bytes", "id_min", "id_max", "extra_paths", "digest", "grid", "_grid"})


def commit_fingerprint(req: "CommitRequest") -> Dict[str, Any]:
    """What makes two commits "the same commit" for an idempotency token.

    The operation and the rows the commit adds: their count and their digest
    (each superfile entry carries the ``digest`` of its rows, see
    :mod:`beam_supertable.digest`; the digests of a commit add up to that of
    all its rows, however they were split into superfiles). A rerun that
    rebuilds the same rows into superfiles with new paths, new ``_id`` s or
    a different split has the same fingerprint. An entry without a digest
    counts by its content-derived fields (everything but its name, path,
    size and ids). Deletion vectors and metadata are not part of it: a
    rebased mutation may target other superfiles for the same rows.

    Returns:
        ``{"rows", "superfiles", "sha256"}``; only ``sha256`` is compared,
        the counts are kept to make a mismatch readable.
    """
    rows = sum(int(e["rows"]) for e in req.add_entries)
    digests = [e["digest"] for e in req.add_entries if isinstance(e.get("digest"), str)]
    others = sorted(_canonical({k: v for k, v in e.items() if k not in _PLACEMENT_FIELDS}).decode()
                    for e in req.add_entries if not isinstance(e.get("digest"), str))
    body = {"operation": req.operation, "rows": rows, "digest": combine(digests),
            "entries": others}
    if req.fingerprint_extra:
        body["extra"] = req.fingerprint_extra   # what a mutation selects, e.g. a delete's filter
    return {"rows": rows, "superfiles": len(req.add_entries),
            "sha256": hashlib.sha256(_canonical(body)).hexdigest()}


def _entry_ids(req: CommitRequest) -> List[str]:
    return [e["id"] for e in req.add_entries]


def _same_rows(a: CommitRequest, b: CommitRequest) -> bool:
    """Whether two requests add the same rows, however their superfiles are built."""
    rows = [commit_fingerprint(CommitRequest(add_entries=r.add_entries))["sha256"] for r in (a, b)]
    return rows[0] == rows[1]


# errno values of failures a retry cannot fix.
_PERMANENT_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EACCES", "EPERM", "ENOENT", "ENOTDIR", "EISDIR", "ENOSPC", "EROFS", "EDQUOT",
    "ENAMETOOLONG", "EINVAL", "EBADF") if hasattr(errno, name))


def _transient(exc: BaseException) -> bool:
    """Whether retrying can fix ``exc``: timeouts, dropped connections, torn reads.

    Lost races (``AlreadyExists``) are handled apart. Permissions, missing
    objects or tables, full or read-only disks and every other supertable
    error are not transient.
    """
    if isinstance(exc, CorruptManifestError):
        return True   # a truncated read; a corrupt object fails every retry, then says so
    if isinstance(exc, StoreIOError):
        return True   # failed in transit after the store's own retries; may have landed
    if isinstance(exc, SupertableError):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, (PermissionError, FileNotFoundError, FileExistsError,
                        IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(exc, OSError) and exc.errno not in _PERMANENT_ERRNOS


def _with_context(exc: BaseException, context: str) -> Optional[BaseException]:
    """A built-in ``OSError`` as the same type with ``context`` (table, step) in
    front, to raise from the original; None for anything else (raised as is)."""
    if type(exc) not in (OSError, PermissionError, FileNotFoundError, FileExistsError,
                         IsADirectoryError, NotADirectoryError):
        return None
    return type(exc)(f"{context}: {exc}")


def _canonical(doc: Dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal(doc: Dict[str, Any]) -> bytes:
    """Serializes a document with the hash of its own canonical form."""
    body = {k: v for k, v in doc.items() if k != "hash"}
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    return _canonical({**body, "hash": digest})


def unseal(data: bytes, where: str) -> Dict[str, Any]:
    """Parses and checks a sealed document; raises CorruptManifestError naming it."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptManifestError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or "hash" not in doc:
        raise CorruptManifestError(f"{where}: no hash field; not a supertable document")
    body = {k: v for k, v in doc.items() if k != "hash"}
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    if digest != doc["hash"]:
        raise CorruptManifestError(
            f"{where}: content hash {digest[:16]}… does not match the recorded "
            f"{str(doc['hash'])[:16]}…; the object is corrupt or truncated")
    if body.get("format_version", 0) > FORMAT_VERSION:
        raise CorruptManifestError(
            f"{where}: format version {body['format_version']} is newer than this "
            f"library reads ({FORMAT_VERSION}); upgrade beam_supertable")
    return body


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclasses.dataclass(frozen=True)
class PartRef:
    """A manifest part referenced by a version."""

    path: str
    count: int      # superfile entries in the part
    rows: int
    level: int      # merges it went through (base-8 counter digit)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CommitRequest:
    """What one commit changes, re-applied on a fresh base after a lost race.

    Args:
        operation: a word for history (``"append"``, ``"delete"``, ...).
        add_entries: superfile entries (JSON-able dicts with at least ``id``,
            ``path`` and ``rows``).
        add_deletes: ``{superfile_id: deletion_vector_path}`` to add.
        set_properties: table properties this commit stamps. A property the
            base already holds with a different value is a conflict (e.g. two
            writers training different grids), unless listed in
            ``replace_properties``.
        replace_properties: property names this commit may overwrite.
        schema: a new table schema; needs ``allow_schema_change``.
        token: idempotency token; a commit whose token already landed with
            the same fingerprint (``commit_fingerprint``) returns that version
            instead of committing again; with another one it raises
            TokenReuseError.
        metadata: user metadata kept in the commit info (e.g. a frontier).
        base_version: the version the writer read; tokens are also searched
            back to it (beyond the recent-token window) when given.
        deleted_rows: rows the new deletion vectors remove (kept in the totals).
        expected_deletes: per superfile gaining a deletion vector, how many it
            had when the writer read it; a concurrent delete is a conflict.
        remove_entries: ids of superfiles the new version no longer holds (a
            rewrite such as ``optimize``); they and their deletion vectors
            leave the version. One that is not in the base is a conflict.
            ``deleted_rows`` should then subtract the deleted rows they held.
    """

    operation: str = "append"
    add_entries: Tuple[dict, ...] = ()
    add_deletes: Dict[str, str] = dataclasses.field(default_factory=dict)
    set_properties: Dict[str, Any] = dataclasses.field(default_factory=dict)
    replace_properties: Tuple[str, ...] = ()
    schema: Optional[pa.Schema] = None
    allow_schema_change: bool = False
    token: Optional[str] = None
    metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)
    base_version: Optional[int] = None
    deleted_rows: int = 0
    expected_deletes: Dict[str, int] = dataclasses.field(default_factory=dict)
    reset: bool = False   # the new version starts empty: ``schema`` and ``set_properties`` only
    fingerprint_extra: str = ""   # what else names this commit for its token (a delete's filter)
    remove_entries: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.add_entries:
            missing = [f for f in ("id", "path", "rows") if f not in entry]
            if missing:
                raise ValueError(f"CommitRequest: entry {entry!r} lacks {missing}")
        try:
            _canonical({"m": self.metadata, "p": self.set_properties})
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"CommitRequest: metadata and properties must be JSON data: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One table version as read: snapshot isolation for a reader."""

    version: int
    schema: pa.Schema
    properties: Dict[str, Any]
    parts: Tuple[PartRef, ...]
    deletes: Dict[str, List[str]]
    totals: Dict[str, int]
    commit: Dict[str, Any]
    recent_tokens: Tuple[str, ...]
    manifest: "Manifest" = dataclasses.field(repr=False, compare=False)
    # True when a commit returned this version because its token had
    # already landed here with the same fingerprint: it committed nothing.
    deduplicated: bool = dataclasses.field(default=False, compare=False)

    def entries(self) -> List[dict]:
        """Every superfile entry of this version (reads the parts, cached)."""
        out: List[dict] = []
        for part in self.parts:
            out.extend(self.manifest.read_part(part.path))
        return out


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


def _writer_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Manifest:
    """Reads versions and commits new ones for the table at ``store``'s root."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._parts: Dict[str, List[dict]] = {}
        self._sleep: Callable[[float], None] = time.sleep

    # -- reading ---------------------------------------------------------
    def read_part(self, path: str) -> List[dict]:
        cached = self._parts.get(path)
        if cached is None:
            doc = unseal(self._get(path), f"{self.store.uri}/{path}")
            cached = self._parts[path] = doc["entries"]
        return cached

    def _get(self, path: str) -> bytes:
        return self.store.get(path)

    def _try_version(self, version: int) -> Optional[Dict[str, Any]]:
        try:
            data = self.store.get(version_path(version))
        except FileNotFoundError:
            return None
        return unseal(data, f"{self.store.uri}/{version_path(version)}")

    def latest_version(self) -> int:
        """The newest version: the hint, then forward probes. O(1) in history."""
        start = None
        try:
            start = int(json.loads(self.store.get(HINT))["version"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            _LOG.warning("%s: unreadable latest-version hint; listing versions", self.store.uri)
        if start is None or not self.store.exists(version_path(start)):
            listed = self._listed_versions()
            if not listed:
                raise NotATableError(
                    f"{self.store.uri}: not a supertable (no {VERSIONS}/ objects)")
            start = listed[-1]
        while self.store.exists(version_path(start + 1)):
            start += 1
        return start

    def _listed_versions(self) -> List[int]:
        found = (version_of(info.path) for info in self.store.list(VERSIONS))
        return sorted(v for v in found if v is not None)

    def exists(self) -> bool:
        try:
            self.latest_version()
            return True
        except NotATableError:
            return False

    def load(self, version: Optional[int] = None) -> Snapshot:
        """Reads one version (the latest by default)."""
        if version is None:
            version = self.latest_version()
        elif not isinstance(version, int) or version < 0:
            raise VersionNotFoundError(
                f"{self.store.uri}: version must be a non-negative int, got {version!r}")
        doc = self._try_version(version)
        if doc is None:
            if not self._listed_versions():
                raise NotATableError(f"{self.store.uri}: not a supertable")
            raise VersionNotFoundError(
                f"{self.store.uri}: version {version} does not exist (latest is "
                f"{self.latest_version()}; vacuumed versions cannot be opened)")
        return self._snapshot(doc)

    def _snapshot(self, doc: Dict[str, Any]) -> Snapshot:
        return Snapshot(
            version=doc["version"],
            schema=schema_from_text(doc["schema"]),
            properties=doc.get("properties", {}),
            parts=tuple(PartRef(**p) for p in doc.get("parts", [])),
            deletes={k: list(v) for k, v in doc.get("deletes", {}).items()},
            totals=doc.get("totals", {}),
            commit=doc.get("commit", {}),
            recent_tokens=tuple(doc.get("recent_tokens", [])),
            manifest=self,
        )

    def history(self) -> List[Dict[str, Any]]:
        """Every retained version with its commit info, oldest first."""
        out = []
        for version in self._listed_versions():
            doc = self._try_version(version)
            if doc is not None:
                out.append({"version": version, **doc.get("commit", {}),
                            "totals": doc.get("totals", {})})
        return out

    # -- writing ---------------------------------------------------------
    def create(self, schema: pa.Schema, properties: Optional[Dict[str, Any]] = None,
               *, metadata: Optional[Dict[str, Any]] = None) -> Snapshot:
        """Creates version 0; raises TableExistsError when a table is there."""
        self.store.check_writable()
        doc = self._document(0, schema, dict(properties or {}), [], {},
                             {"rows": 0, "superfiles": 0, "deleted": 0}, "create", None,
                             metadata or {}, [])
        try:
            self.store.put_if_absent(version_path(0), seal(doc))
        except AlreadyExists as exc:
            raise TableExistsError(f"{self.store.uri}: a supertable already exists here") from exc
        self._write_hint(0)
        return self._snapshot(doc)

    def _document(self, version, schema, properties, parts, deletes, totals, operation,
                  token, metadata, recent_tokens) -> Dict[str, Any]:
        return {
            "format": "supertable",
            "format_version": FORMAT_VERSION,
            "version": version,
            "schema": schema_to_text(schema),
            "columns": schema.names,
            "properties": properties,
            "parts": [p.to_json() for p in parts],
            "deletes": deletes,
            "totals": totals,
            "recent_tokens": recent_tokens,
            "commit": {
                "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "operation": operation,
                "writer": _writer_id(),
                "token": token,
                "metadata": metadata,
                "parent": version - 1 if version else None,
            },
        }

    def _write_hint(self, version: int) -> None:
        # Best effort: readers probe forward from a stale hint anyway.
        try:
            self.store.put(HINT, json.dumps({"version": version}).encode())
        except Exception as exc:  # noqa: BLE001 - the commit already landed
            _LOG.warning("%s: could not update the latest-version hint to %d: %s",
                         self.store.uri, version, exc)

    def _find_token(self, token: str, base: Snapshot, since: Optional[int]) -> Optional[Snapshot]:
        if token in base.recent_tokens:
            # The recent window says it landed at or before base; find which.
            version = base.version
            while version >= 0:
                doc = self._try_version(version)
                if doc is None:
                    break
                if doc.get("commit", {}).get("token") == token:
                    return self._snapshot(doc)
                version -= 1
            # Its version was vacuumed: what it committed cannot be checked
            # against this commit, so neither skipping nor committing is safe.
            raise TokenReuseError(
                f"{self.store.uri}: token {token!r} landed in a version that has since been "
                f"vacuumed (the oldest retained is after {version}), so this commit on "
                f"version {base.version} cannot be checked against it; use a fresh token",
                token=token, landed_version=None, base_version=base.version)
        if since is not None and since <= base.version - RECENT_TOKENS:
            # ``since`` itself may hold the token (a handle standing on its own commit).
            for version in range(base.version - RECENT_TOKENS, since - 1, -1):
                doc = self._try_version(version)
                if doc is not None and doc.get("commit", {}).get("token") == token:
                    return self._snapshot(doc)
        return self._find_token_marker(token, base)

    def _find_token_marker(self, token: str, base: Snapshot) -> Optional[Snapshot]:
        """The version at or below ``base`` holding ``token``, by its markers.

        One listing of the token's folder plus one read per version a commit
        with the token tried (normally none or one): the cost does not grow
        with the table's history. A marker above ``base`` belongs to an
        attempt this base cannot show yet; the next round's base will.
        """
        markers = []
        for info in self.store.list(token_folder(token)):
            version = _marker_version(info.path)
            if version is not None and version <= base.version:
                markers.append((version, info.path))
        for version, path in sorted(markers, reverse=True):
            doc = self._try_version(version)
            if doc is None:
                raise TokenReuseError(
                    f"{self.store.uri}: a commit with token {token!r} tried version {version}, "
                    f"which has since been vacuumed, so whether the token landed there "
                    f"cannot be told and this commit on version {base.version} cannot be "
                    f"checked against it; use a fresh token",
                    token=token, landed_version=None, base_version=base.version)
            if doc.get("commit", {}).get("token") == token:
                return self._snapshot(doc)
            # Another commit holds that version: the marker's attempt lost its
            # race for good (versions are immutable), so it can go.
            self._drop_marker(path)
        return None

    def _mark_token(self, token: str, version: int) -> None:
        """Leaves the token's marker for ``version`` (before creating it)."""
        try:
            self.store.put_if_absent(token_marker_path(token, version), json.dumps(
                {"token": token, "version": version}, sort_keys=True).encode())
        except AlreadyExists:
            pass  # the same token tried this version before (a retry): one marker does

    def _drop_marker(self, path: str) -> None:
        # Best effort: a stale marker costs a read of its version, never correctness.
        try:
            self.store.delete(path)
        except Exception as exc:  # noqa: BLE001 - the marker is only a hint
            _LOG.info("%s: could not remove stale token marker %s: %s",
                      self.store.uri, path, exc)

    def _rebase(self, base: Snapshot, req: CommitRequest,
                own_part: Optional[PartRef]) -> Dict[str, Any]:
        """Builds the next version document from ``base``; raises on a real conflict."""
        if req.reset:
            # An overwrite: the next version holds nothing of the base but its
            # history (older versions still read their own rows).
            base = dataclasses.replace(base, schema=req.schema or base.schema, properties={},
                                       parts=(), deletes={}, totals={})
        schema = base.schema
        if req.schema is not None and not req.schema.equals(base.schema):
            if not req.allow_schema_change:
                raise SchemaMismatchError(
                    f"{self.store.uri}: commit changes the schema from\n{base.schema}\nto\n"
                    f"{req.schema}\nwithout allow_schema_change=True")
            schema = req.schema
        properties = dict(base.properties)
        for name, value in req.set_properties.items():
            held = properties.get(name)
            if held is not None and held != value and name not in req.replace_properties:
                raise CommitConflictError(
                    f"{self.store.uri}: property {name!r} is already {held!r} at version "
                    f"{base.version}; this commit would set {value!r} (a concurrent writer "
                    f"stamped it first; reload and rebuild against it)")
            properties[name] = value
        known = {e["id"] for e in req.add_entries}
        for sf, count in req.expected_deletes.items():
            if len(base.deletes.get(sf, [])) != count:
                raise CommitConflictError(
                    f"{self.store.uri}: superfile {sf} gained deletion vectors since this "
                    f"commit read it (version {base.version}); re-run the mutation")
        deletes = {k: list(v) for k, v in base.deletes.items()}
        for sf, path in req.add_deletes.items():
            deletes.setdefault(sf, []).append(path)
        parts = list(base.parts)
        rows = sum(e["rows"] for e in req.add_entries)
        removed = 0
        if req.remove_entries:
            parts, removed_rows, removed = self._remove(base, parts, req.remove_entries)
            rows -= removed_rows
            for sf in req.remove_entries:
                deletes.pop(sf, None)
        if own_part is not None:
            parts.append(own_part)
            parts = self._merge_parts(parts)
        present = self._superfile_ids(parts) if set(req.add_deletes) - known else set()
        missing = [sf for sf in req.add_deletes if sf not in known and sf not in present]
        if missing:
            raise CommitConflictError(
                f"{self.store.uri}: deletion vectors name superfiles {missing[:5]} that are "
                f"not in version {base.version} (removed by a concurrent commit?)")
        totals = {
            "rows": base.totals.get("rows", 0) + rows,
            "superfiles": base.totals.get("superfiles", 0) + len(req.add_entries) - removed,
            "deleted": base.totals.get("deleted", 0) + req.deleted_rows,
        }
        recent = list(base.recent_tokens)
        if req.token is not None:
            recent = (recent + [req.token])[-RECENT_TOKENS:]
        return self._document(base.version + 1, schema, properties, parts, deletes, totals,
                              req.operation, req.token, req.metadata, recent)

    def _remove(self, base: Snapshot, parts: List[PartRef], ids_: Sequence[str]
                ) -> Tuple[List[PartRef], int, int]:
        """``parts`` without the entries ``ids_``: the parts holding them are
        replaced, in place, by one part of what they keep (written at the
        level of the first). Returns (parts, rows removed, entries removed)."""
        remove = set(ids_)
        out: List[PartRef] = []
        kept: List[dict] = []
        found: set = set()
        rows = 0
        at, level = None, 0
        for part in parts:
            entries = self.read_part(part.path)
            hit = [e for e in entries if e["id"] in remove]
            if not hit:
                out.append(part)
                continue
            if at is None:
                at, level = len(out), part.level
            found.update(e["id"] for e in hit)
            rows += sum(e["rows"] for e in hit)
            kept.extend(e for e in entries if e["id"] not in remove)
        missing = sorted(remove - found)
        if missing:
            raise CommitConflictError(
                f"{self.store.uri}: this commit rewrites superfiles {missing[:5]} that are not "
                f"in version {base.version} (removed by a concurrent rewrite?)")
        if kept:
            out.insert(at, self._write_part(kept, level))
        return out, rows, len(found)

    def _superfile_ids(self, parts: Sequence[PartRef]) -> set:
        # One pass over the parts, not one per deletion vector: an upsert may
        # add a vector to every superfile.
        return {e["id"] for p in parts for e in self.read_part(p.path)}

    def _write_part(self, entries: List[dict], level: int) -> PartRef:
        path = f"{PARTS}/{uuid.uuid4().hex}.json"
        self.store.put_if_absent(path, seal({"format_version": FORMAT_VERSION, "entries": entries}))
        self._parts[path] = entries
        return PartRef(path, len(entries), sum(e["rows"] for e in entries), level)

    def _merge_parts(self, parts: List[PartRef]) -> List[PartRef]:
        while len(parts) >= PART_FANOUT and len({p.level for p in parts[-PART_FANOUT:]}) == 1:
            tail = parts[-PART_FANOUT:]
            merged: List[dict] = []
            for p in tail:
                merged.extend(self.read_part(p.path))
            parts = parts[:-PART_FANOUT] + [self._write_part(merged, tail[0].level + 1)]
        return parts

    def commit(self, req: CommitRequest, *, max_retries: int = DEFAULT_MAX_RETRIES,
               base: Optional[Snapshot] = None,
               rebuild: Optional[Callable[[Snapshot], Optional[CommitRequest]]] = None
               ) -> Snapshot:
        """Commits ``req`` as the next version, rebasing and retrying on lost races.

        Args:
            rebuild: called with the base before every attempt (after the
                token check); returns the request to commit on exactly that
                base, or None when nothing is left to commit (the base is then
                returned). Mutations use it to resolve which rows they remove
                against the version they land on. The rebuilt request must
                carry the rows of ``req.add_entries`` (their superfiles are
                written once, before the race; a rebuild may replace them with
                superfiles of the same rows, e.g. re-celled on a grid another
                writer stamped meanwhile) and ``req.token``.

        Returns:
            The version that holds the commit: the new one, or the one where
            ``req.token`` already landed with the same fingerprint (then
            ``deduplicated`` is True and nothing was committed).

        Raises:
            CommitFailedError: the commit did not land within ``max_retries``
                retries (lost races, timeouts, dropped connections); the
                message says how many attempts were made and the last reason.
                A subclass of CommitConflictError.
            CommitConflictError: the commit conflicts with a newer version in
                a way a rebase cannot resolve.
            TokenReuseError: ``req.token`` already landed with a different
                commit (see ``commit_fingerprint``).
            SchemaMismatchError: the commit changes the schema without leave.
            OSError: a failure retrying cannot fix (``PermissionError``, a
                missing table or object, a full disk...), at once, with the
                table and the step in the message and the original chained.
        """
        self.store.check_writable()
        fingerprint = commit_fingerprint(req) if req.token is not None else None
        attempted: Dict[int, Dict[str, Any]] = {}   # version -> commit info this call sent
        attempt = 0
        own_part, own_ids = None, None
        while True:
            doc = None
            step = "writing the commit's manifest part"
            try:
                if own_part is None and req.add_entries:
                    # Written once, outside the race: a lost race only rebuilds
                    # the small version document (and any merge it implies).
                    own_part = self._write_part(list(req.add_entries), level=0)
                    own_ids = _entry_ids(req)
                step = "loading the latest version"
                if base is None:
                    base = self.load()
                if attempted and req.token is None:
                    # Without a token, a create of ours whose answer (and read-back)
                    # was lost is found by the commit info we sent, never committed twice.
                    step = "looking for this call's own earlier create"
                    mine = self._own_landed(attempted, base)
                    if mine is not None:
                        return mine
                if req.token is not None:
                    step = f"looking for token {req.token!r}"
                    landed = self._find_token(req.token, base, req.base_version)
                    if landed is not None:
                        return self._landed(req, fingerprint, landed, base, attempted)
                attempt_req = req
                if rebuild is not None:
                    step = f"resolving the mutation on version {base.version}"
                    attempt_req = rebuild(base)
                    if attempt_req is None:
                        return base
                    if _entry_ids(attempt_req) != _entry_ids(req) and not _same_rows(attempt_req,
                                                                                     req):
                        raise ValueError("Manifest.commit: rebuild must keep req.add_entries "
                                         "(the same rows; it may only rebuild their superfiles)")
                    if own_part is not None and _entry_ids(attempt_req) != own_ids:
                        # The rows rebuilt for this base (another grid): a part of their own.
                        step = "writing the commit's rebuilt manifest part"
                        own_part = self._write_part(list(attempt_req.add_entries), level=0)
                        own_ids = _entry_ids(attempt_req)
                step = f"rebasing on version {base.version}"
                doc = self._rebase(base, attempt_req, own_part)
                if req.token is not None:
                    doc["commit"]["fingerprint"] = fingerprint
                    step = f"marking token {req.token!r} for version {doc['version']}"
                    self._mark_token(req.token, doc["version"])
                step = f"creating {version_path(doc['version'])}"
                attempted[doc["version"]] = json.loads(_canonical(doc["commit"]))
                self.store.put_if_absent(version_path(doc["version"]), seal(doc))
                self._write_hint(doc["version"])
                if req.token is not None:
                    # The token is not at any version this call tried before
                    # (the token check before this attempt looked): their
                    # markers lost their races.
                    for lost in attempted:
                        if lost != doc["version"]:
                            self._drop_marker(token_marker_path(req.token, lost))
                return self._snapshot(doc)
            except AlreadyExists as exc:
                reason, cause = "lost the race", exc
            except Exception as exc:
                if not _transient(exc):
                    wrapped = _with_context(exc, f"{self.store.uri}: commit ({req.operation}) "
                                                 f"failed while {step}")
                    if wrapped is None:
                        raise
                    raise wrapped from exc
                # A failed create may still have landed: with a token the next
                # round's token check tells; without one, compare the object.
                reason, cause = f"{type(exc).__name__}: {exc}", exc
                if doc is not None and req.token is None:
                    if self._safe_try_version(doc["version"]) == doc:
                        self._write_hint(doc["version"])
                        return self._snapshot(doc)
            if attempt >= max_retries:
                raise CommitFailedError(
                    f"{self.store.uri}: commit ({req.operation}) did not land after "
                    f"{attempt + 1} attempts; last: {reason}") from cause
            delay = backoff_seconds(attempt)
            _LOG.info("%s: commit attempt %d on version %s %s; retrying in %.0f ms",
                      self.store.uri, attempt + 1, None if base is None else base.version,
                      reason, delay * 1000)
            self._sleep(delay)
            attempt += 1
            base = self._reload(base)

    def _own_landed(self, attempted: Dict[int, Dict[str, Any]],
                    base: Snapshot) -> Optional[Snapshot]:
        """The version this call created in an earlier attempt, if one landed."""
        for version in sorted(v for v in attempted if v <= base.version):
            doc = self._try_version(version)
            if doc is not None and doc.get("commit") == attempted[version]:
                self._write_hint(version)
                return self._snapshot(doc)
        return None

    def _landed(self, req: CommitRequest, fingerprint: Dict[str, Any], landed: Snapshot,
                base: Snapshot, attempted: Dict[int, Dict[str, Any]]) -> Snapshot:
        """The result of a commit whose token is already in ``landed``."""
        if attempted.get(landed.version) == landed.commit:
            # This call's own create landed though it reported a failure.
            self._write_hint(landed.version)
            return landed
        recorded = landed.commit.get("fingerprint") if landed.commit.get("token") == req.token \
            else None
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
        return dataclasses.replace(landed, deduplicated=True)

    def _safe_try_version(self, version: int) -> Optional[Dict[str, Any]]:
        try:
            return self._try_version(version)
        except (OSError, TimeoutError, CorruptManifestError):
            return None

    def _reload(self, base: Optional[Snapshot]) -> Optional[Snapshot]:
        """The newest version after ``base``, or None to load afresh next round."""
        if base is None:
            return None
        try:
            version = base.version
            while self.store.exists(version_path(version + 1)):
                version += 1
            return base if version == base.version else self.load(version)
        except Exception as exc:
            # A version that vanished between the probe and the read: load
            # afresh rather than give up (a missing table still fails there).
            if not _transient(exc) and not isinstance(exc, VersionNotFoundError):
                wrapped = _with_context(exc, f"{self.store.uri}: reloading after version "
                                             f"{base.version} failed")
                if wrapped is None:
                    raise
                raise wrapped from exc
            _LOG.info("%s: reload failed (%s); loading afresh", self.store.uri, exc)
            return None

    # -- maintenance -----------------------------------------------------
    def referenced(self, snapshot: Snapshot) -> set:
        """Every object path a version needs."""
        refs = {version_path(snapshot.version)}
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
                referenced |= self.referenced(self._snapshot(doc))
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
                      path.rsplit("/", 1)[-1].startswith(".tmp-")):
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
        return plan.report()
