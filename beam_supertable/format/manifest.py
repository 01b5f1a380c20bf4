"""Table versions and the optimistic-concurrency commit.

Layout under the table root::

    _supertable/versions/<N:020d>.json   version N; creating it IS the commit
    _supertable/parts/<uuid>.json        manifest parts: superfile entries, immutable
    _supertable/latest.json              hint: a recent version number (may lag)
    _supertable/tokens/<sha256(token)>/<N:020d>.json
                                         token marker: a commit with this token
                                         tried to create version N (JSON)
    _supertable/tokens/index/<start>-<end>-<digest>.json
                                         folded markers of vacuumed versions whose
                                         commits fell in [start, end) (sorted, immutable)

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
are kept for the table's ``token_retention`` (default 7 days): a token is
remembered for that long after the commit that carried it, then forgotten
(a rerun commits again). Vacuum folds the markers of the versions it removes
into ``tokens/index/`` objects (see ``format.tokens``), so a token whose
version was vacuumed is still recognised within its retention.

Commit cost does not grow with the table: a commit writes one new part with
its own entries and references the base's parts unchanged; parts are merged
eight at a time (a base-8 counter), so a table of ``n`` superfiles has
``O(log n)`` parts and a commit rewrites nothing in 7 of 8 cases.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import random
import socket
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pyarrow as pa

from beam_supertable._moved import old_names
from beam_supertable.errors import (
    AlreadyExists, CommitConflictError, CommitFailedError, CorruptManifestError, NotATableError,
    SchemaMismatchError, StoreIOError, SupertableError, TableExistsError, VersionNotFoundError)
from beam_supertable.format import documents as _documents
from beam_supertable.format import tokens as _tokens
from beam_supertable.format import vacuum as _vacuum
from beam_supertable.format.documents import (
    FORMAT_VERSION, HINT, PARTS, RECENT_TOKENS, VERSIONS, CommitRequest, PartRef, Snapshot,
    _canonical, _entry_ids, _same_rows, commit_fingerprint, iso_of, schema_from_text,
    schema_to_text, seal, token_retention_of, unseal, version_of, version_path)
from beam_supertable.format.store import ObjectStore
from beam_supertable.format.tokens import TokenIndex, token_marker_path
from beam_supertable.format.vacuum import Vacuum, VacuumPlan, VacuumReport
from beam_supertable.format.views import DerivedView, views_for

__all__ = [
    "CommitRequest", "Manifest", "PartRef", "Snapshot", "VacuumPlan", "VacuumReport",
    "backoff_seconds", "commit_fingerprint",
]

_LOG = logging.getLogger(__name__)


DEFAULT_MAX_RETRIES = 10
BACKOFF_BASE_S = 0.010
BACKOFF_CAP_S = 1.0
BACKOFF_JITTER = 0.30
PART_FANOUT = 8


def backoff_seconds(attempt: int, rng: random.Random = random) -> float:
    """10 ms × 2^attempt, at most 1 s, ±30% jitter."""
    base = min(BACKOFF_BASE_S * (2 ** attempt), BACKOFF_CAP_S)
    return base * (1 + rng.uniform(-BACKOFF_JITTER, BACKOFF_JITTER))


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


def _writer_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Manifest(TokenIndex, Vacuum):
    """Reads versions and commits new ones for the table at ``store``'s root."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._parts: Dict[str, List[dict]] = {}
        self._sleep: Callable[[float], None] = time.sleep
        self.views: List[DerivedView] = views_for(self)

    def clock(self) -> float:
        """Seconds since the epoch: what commits stamp and vacuum measures ages and
        the token horizon by (replace it on an instance, or the class, to move time)."""
        return time.time()

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
            if self._listed_versions():
                # Vacuum removes version 0 of a table that lives on: creating it
                # again would hide every later version behind a new, empty one.
                raise AlreadyExists(version_path(0))
            self.store.put_if_absent(version_path(0), seal(doc))
        except AlreadyExists as exc:
            raise TableExistsError(f"{self.store.uri}: a supertable already exists here") from exc
        self._write_hint(0)
        return self._landed_new(self._snapshot(doc))

    def _landed_new(self, snapshot: Snapshot) -> Snapshot:
        """A version this call created, once the derived faces (the Iceberg
        metadata, when the table keeps it) have been told of it."""
        for view in self.views:
            try:
                view.after_commit(snapshot)
            except Exception as exc:  # noqa: BLE001 - the version landed; say what lags
                _LOG.warning("%s: version %d landed, but %s failed after it (%s: %s)",
                             self.store.uri, snapshot.version, type(view).__name__,
                             type(exc).__name__, exc)
        return snapshot

    def view(self, kind: type) -> Any:
        """This manifest's view of the registered face ``kind`` (e.g. the Iceberg metadata)."""
        for view in self.views:
            if isinstance(view, kind):
                return view
        raise LookupError(f"{self.store.uri}: no {kind.__name__} view is registered")

    def _document(self, version, schema, properties, parts, deletes, totals, operation,
                  token, metadata, recent_tokens) -> Dict[str, Any]:
        now = self.clock()
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
                "timestamp": iso_of(now),
                "operation": operation,
                "writer": _writer_id(),
                "token": token,
                "metadata": metadata,
                "parent": version - 1 if version else None,
                # Tokens of commits since then are still recognised (the horizon in force).
                "token_horizon": iso_of(now - token_retention_of(properties)),
            },
        }

    def _write_hint(self, version: int) -> None:
        # Best effort: readers probe forward from a stale hint anyway.
        try:
            self.store.put(HINT, json.dumps({"version": version}).encode())
        except Exception as exc:  # noqa: BLE001 - the commit already landed
            _LOG.warning("%s: could not update the latest-version hint to %d: %s",
                         self.store.uri, version, exc)


    def _rebase(self, base: Snapshot, req: CommitRequest,
                own_part: Optional[PartRef]) -> Dict[str, Any]:
        """Builds the next version document from ``base``; raises on a real conflict."""
        if req.reset:
            # An overwrite: the next version holds nothing of the base but its
            # history (older versions still read their own rows).
            base = dataclasses.replace(base, schema=req.schema or base.schema, properties={},
                                       parts=(), deletes={}, totals={})
        schema = base.schema
        if req.schema is not None and not req.schema.remove_metadata().equals(  # ids count
                base.schema.remove_metadata(), check_metadata=req.allow_schema_change):
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
                    landed = self._find_token(req.token, base, req.base_version,
                                              RECENT_TOKENS)
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
                if own_part is not None:
                    # This commit's entries alone, even once merged into a bigger part:
                    # what the change feed reads of it (kept by vacuum with the version).
                    doc["commit"]["part"] = own_part.path
                if req.token is not None:
                    doc["commit"]["fingerprint"] = fingerprint
                    step = f"marking token {req.token!r} for version {doc['version']}"
                    self._mark_token(req.token, doc["version"], doc["commit"])
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
                return self._landed_new(self._snapshot(doc))
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
                        return self._landed_new(self._snapshot(doc))
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


# Defined in other modules; public under this module's name (repr, pickles).
for _public in (CommitRequest, PartRef, Snapshot, VacuumPlan, VacuumReport,):
    _public.__module__ = __name__
del _public


# Names this module re-exported before the package's folders.
__getattr__ = old_names(__name__, (_documents.__name__, _tokens.__name__, _vacuum.__name__))
