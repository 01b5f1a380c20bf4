"""The manifest's documents: object layout, sealed JSON, commit requests, snapshots.

Everything a reader of ``_supertable/`` needs to decode what is stored there;
no I/O. The layout and the commit protocol are described in
:mod:`beam_supertable.format.manifest`."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
from typing import Any, Dict, List, Optional, Protocol, Tuple

import pyarrow as pa

from beam_supertable.errors import CorruptManifestError
from beam_supertable.format.digest import combine
from beam_supertable.format.fields import with_ids

FORMAT_VERSION = 1
META = "_supertable"
VERSIONS = f"{META}/versions"
PARTS = f"{META}/parts"
TOKENS = f"{META}/tokens"
HINT = f"{META}/latest.json"
VERSION_DIGITS = 20


RECENT_TOKENS = 128          # tokens of the latest commits, carried by each version
TOKEN_INDEX = f"{TOKENS}/index"   # folded markers: one sorted, immutable object per period
TOKEN_RETENTION = "token_retention"   # table property: seconds a token is remembered
DEFAULT_TOKEN_RETENTION_S = 7 * 24 * 3600


MAX_RETENTION_S = 100 * 365 * 86400   # past this, dates overflow (and it means "for ever")


def retention_seconds(value: Any, what: str = "token_retention") -> float:
    """A token retention as seconds > 0 (a number of seconds or a ``timedelta``)."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    try:
        seconds = float(value) if isinstance(value, (int, float)) \
            and not isinstance(value, bool) else None
    except OverflowError:   # an int past a float's range
        seconds = None
    if seconds is None or not 0 < seconds <= MAX_RETENTION_S:
        raise ValueError(f"{what} must be a positive number of seconds (at most 100 years) "
                         f"or a timedelta, got {value!r}")
    return seconds


def token_retention_of(properties: Dict[str, Any]) -> float:
    """The token retention a version's properties put in force (seconds)."""
    held = properties.get(TOKEN_RETENTION)
    return float(held) if isinstance(held, (int, float)) and held > 0 \
        else float(DEFAULT_TOKEN_RETENTION_S)


def epoch_of(timestamp: Any) -> Optional[float]:
    """Seconds since the epoch of a commit's ISO timestamp; None when unreadable."""
    try:
        moment = datetime.datetime.fromisoformat(str(timestamp))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def iso_of(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat()


def version_path(version: int) -> str:
    return f"{VERSIONS}/{version:0{VERSION_DIGITS}d}.json"


def version_of(path: str) -> Optional[int]:
    """The version number of a ``versions/<N>.json`` path, else None."""
    if not path.startswith(VERSIONS + "/"):
        return None
    name = path.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


# Entry fields that say where and under which ids rows were written, not what
# they are: a rerun writes the same rows under new names and new ids.
_PLACEMENT_FIELDS = frozenset(
    {"id", "path", "bytes", "id_min", "id_max", "extra_paths", "digest", "grid", "_grid"})


def commit_fingerprint(req: "CommitRequest") -> Dict[str, Any]:
    """What makes two commits "the same commit" for an idempotency token.

    The operation and the rows the commit adds: their count and their digest
    (each superfile entry carries the ``digest`` of its rows, see
    :mod:`beam_supertable.format.digest`; the digests of a commit add up to that of
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
    # Every persisted schema holds its field ids (see format/fields.py).
    return base64.b64encode(with_ids(schema).serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    # A schema written before ids were recorded gets the ids the Iceberg face gave it.
    return with_ids(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))))


class PartSource(Protocol):
    """What a snapshot reads its parts through (the ``Manifest`` that loaded it)."""

    def read_part(self, path: str) -> List[dict]: ...


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
    manifest: PartSource = dataclasses.field(repr=False, compare=False)
    # True when a commit returned this version because its token had
    # already landed here with the same fingerprint: it committed nothing.
    deduplicated: bool = dataclasses.field(default=False, compare=False)

    def entries(self) -> List[dict]:
        """Every superfile entry of this version (reads the parts, cached)."""
        out: List[dict] = []
        for part in self.parts:
            out.extend(self.manifest.read_part(part.path))
        return out
