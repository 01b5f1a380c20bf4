"""Every version of a supertable as an Apache Iceberg v2 snapshot over the same objects.

Iceberg readers (pyiceberg, Spark, Trino, Flink, DuckDB, Beam's IcebergIO)
read the superfiles as Parquet data files and the deletion vectors as
position delete files; only metadata is added, under ``metadata/``:

- ``metadata/v<N>.metadata.json``: the table metadata of version N, whose
  current snapshot (id N) reads exactly as version N; it also lists the
  snapshots of the versions before it it knows of (up to
  ``SNAPSHOTS_KEPT``), for time travel. ``metadata/version-hint.text`` holds
  the newest N written (the Hadoop-catalog convention; it may lag).
- ``metadata/snap-<N>.avro``: the manifest list of snapshot N.
- ``metadata/<part>-data.avro``: the data manifest of one manifest part; a
  part is immutable and shared by versions, and so is its manifest.
- ``metadata/<N>-deletes-<digest>.avro``: the position delete files version N
  added (or, every few versions, all of them in one manifest).
- ``deletes/<uuid>.pos.parquet``: a deletion vector as an Iceberg position
  delete file (``file_path``, ``pos``).

The table's tags are tag refs (``"refs": {"<tag>": {"snapshot-id": N, "type":
"tag"}}``) in the metadata written after they change: the latest version's
metadata is rewritten with them when a tag is created, moved or deleted (and
by ``sync``), and every later version's carries them.

Everything is a function of version N (and of objects that exist already):
two writers that write the metadata of one version write the same objects,
each with an atomic create, so a reader never sees two different
``v<N>.metadata.json``. The metadata of version N is written right after the
version document is created, by the committing process's metadata thread
(:mod:`~beam_supertable.iceberg.background`), so the commit does not wait for
it; one that is missing (a crash in between) is written by the next
``iceberg_metadata_location``, or by ``beam-supertable iceberg sync``. A version without its metadata is invisible to Iceberg readers,
never read as an empty table.

Why this module is long: it is the one writer of the format (metadata, manifest lists,
manifests, position deletes) with its repair and relocation, each of which
needs the others' paths and caches.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import io
import json
import logging
import os
import re
import threading
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable.errors import (
    AlreadyExists, CorruptManifestError, SchemaMismatchError, VersionNotFoundError)
from beam_supertable.format import deletes as dv, tags as tag_records
from beam_supertable.format.documents import Snapshot
from beam_supertable.format.store import ObjectStore
from beam_supertable.iceberg import background
from beam_supertable.iceberg.avro import (
    DATA, DELETES, POSITION_DELETES, data_file, manifest_bytes, manifest_list_bytes,
    manifest_list_entry, read_manifest, read_manifest_list)
from beam_supertable.iceberg.refs import with_tags
from beam_supertable.iceberg.schema import iceberg_schema

__all__ = ["ENABLED_PROPERTY", "METADATA", "IcebergMetadata", "metadata_path", "referenced",
           "settle"]

METADATA = "metadata"
VERSION_HINT = f"{METADATA}/version-hint.text"
ENABLED_PROPERTY = "iceberg"            # table property: ENABLED_VALUE when on
ENABLED_VALUE = {"format_version": 2}
SNAPSHOTS_KEPT = 100                    # snapshots a metadata file lists, newest first
CONSOLIDATE_AFTER = 8                   # delete manifests before they are merged into one
# Reserved field ids of position delete files (Iceberg spec, "Reserved Field IDs").
FILE_PATH_ID, POS_ID = 2147483546, 2147483545
_POSITION_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False,
             metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False,
             metadata={b"PARQUET:field_id": str(POS_ID).encode()})])
_OPERATIONS = {"append": "append", "upsert": "overwrite", "delete": "delete",
               "optimize": "replace", "overwrite": "overwrite"}

_LOG = logging.getLogger(__name__)


def metadata_path(version: int) -> str:
    return f"{METADATA}/v{version}.metadata.json"


def manifest_list_path(version: int) -> str:
    return f"{METADATA}/snap-{version}.avro"


def data_manifest_path(part_path: str) -> str:
    return f"{METADATA}/{part_path.rsplit('/', 1)[-1][:-len('.json')]}-data.avro"


def delete_manifest_path(version: int, files: List[Dict[str, Any]]) -> str:
    """Named by its content too: writers of one version that saw different delete
    manifests before it write different files, each consistent with its own list."""
    digest = hashlib.sha256("\n".join(f["file_path"] for f in files).encode()).hexdigest()
    return f"{METADATA}/{version}-deletes-{digest[:16]}.avro"


def position_deletes_path(dv_path: str) -> str:
    return dv_path[:-len(".dv")] + ".pos.parquet"


def check_schema(uri: str, schema: pa.Schema) -> None:
    """Raises SchemaMismatchError, naming the column, when ``schema`` has no Iceberg form."""
    try:
        iceberg_schema(schema)
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(f"{uri}: {exc}") from None


def has_iceberg_form(uri: str, schema: pa.Schema) -> bool:
    """Whether ``schema`` has an Iceberg form; when not, a warning names the column."""
    try:
        check_schema(uri, schema)
    except SchemaMismatchError as exc:
        _LOG.warning("%s; the table is created without Iceberg metadata", exc)
        return False
    return True


def is_enabled(snapshot: Snapshot) -> bool:
    return isinstance(snapshot.properties.get(ENABLED_PROPERTY), dict)


def table_location(store: ObjectStore) -> str:
    """The table's absolute URI, as Iceberg metadata names files."""
    if store.protocol in ("file", "local"):
        return store.root
    return f"{store.protocol}://{store.root}"


def _millis(timestamp: str) -> int:
    moment = datetime.datetime.fromisoformat(timestamp)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


class IcebergMetadata:
    """Writes (and repairs) the Iceberg metadata of a table's versions.

    A derived view (:mod:`beam_supertable.format.views`): one per
    :class:`~beam_supertable.format.manifest.Manifest`, told of each version it
    commits and asked by its vacuum what to keep. It remembers the manifest
    list and metadata it wrote or read last, so a writer committing version
    after version reads nothing back.
    """

    @classmethod
    def of(cls, manifest: Any) -> "IcebergMetadata":
        """The view of ``manifest``'s table (the factory registered for every manifest)."""
        return cls(manifest.store, manifest.read_part, manifest.load)

    def __init__(self, store: ObjectStore, read_part, load) -> None:
        self.store = store
        self._read_part = read_part
        self._load = load
        self._lists: Dict[int, List[Dict[str, Any]]] = {}      # version -> manifest list
        self._tables: Dict[int, Dict[str, Any]] = {}           # version -> metadata JSON
        self._delete_files: Dict[str, List[Dict[str, Any]]] = {}   # delete manifest -> files
        # The metadata thread and the caller share the caches above.
        self._locked: Tuple[Optional[int], Any] = (None, None)

    @property
    def _lock(self) -> "threading.RLock":
        pid, lock = self._locked
        if pid != os.getpid():
            # A forked child: the parent's lock may be held by a thread not here.
            lock = threading.RLock()
            self._locked = (os.getpid(), lock)
        return lock

    def _settled(self) -> "threading.RLock":
        """The view's lock, taken once this process's queued metadata of the table is
        written: what follows reads or changes what that writing would."""
        settle(self.store)
        return self._lock

    # -- reading what exists -------------------------------------------------
    def _get_json(self, path: str) -> Optional[Dict[str, Any]]:
        try:
            return json.loads(self.store.get(path))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise CorruptManifestError(
                f"{self.store.uri}: {path} is not valid JSON ({exc}); delete it and it is "
                "written again") from exc

    def _table_json(self, version: int) -> Optional[Dict[str, Any]]:
        if version not in self._tables:
            found = self._get_json(metadata_path(version))
            if found is None:
                return None
            self._remember(self._tables, version, found)
            return found    # (an old version is not kept among the newest four)
        return self._tables[version]

    def _manifest_list(self, version: int) -> Optional[List[Dict[str, Any]]]:
        if version not in self._lists:
            try:
                data = self.store.get(manifest_list_path(version))
            except FileNotFoundError:
                return None
            listed = read_manifest_list(data)
            self._remember(self._lists, version, listed)
            return listed
        return self._lists[version]

    @staticmethod
    def _remember(cache: Dict[int, Any], version: int, value: Any) -> None:
        cache[version] = value
        for old in sorted(cache)[:-4]:
            del cache[old]

    def ensure(self, snapshot: Snapshot) -> str:
        """The metadata path of ``snapshot``'s version, written when missing, checked when not.

        Raises:
            CorruptManifestError: the file is there but is not this version's
                metadata (torn, or written by something else); it is never
                taken for an empty table.
        """
        with self._settled():
            return self._ensure(snapshot)

    def _ensure(self, snapshot: Snapshot) -> str:
        version = snapshot.version
        found = self._table_json(version)
        if found is None:
            # On demand, maybe for an earlier version: the hint never goes back.
            return self.write(snapshot, hint=self._hint_at_most(version))
        if found.get("format-version") != 2 \
                or found.get("current-snapshot-id") != (version or None) \
                or found.get("properties", {}).get("beam_supertable.version") != str(version):
            self._tables.pop(version, None)
            raise CorruptManifestError(
                f"{self.store.uri}: {metadata_path(version)} is not the Iceberg metadata of "
                f"version {version}; delete it and it is written again")
        if found.get("location") != table_location(self.store):
            raise CorruptManifestError(
                f"{self.store.uri}: {metadata_path(version)} was written for the table at "
                f"{found.get('location')} (the table was copied or moved here); run "
                "`beam-supertable iceberg sync --table URI` (Supertable.sync_iceberg()) once: "
                "it writes the metadata for this location")
        return metadata_path(version)

    # -- a table that moved ----------------------------------------------------
    def moved_from(self, version: int) -> Optional[str]:
        """The other location ``version``'s metadata was written for, or None (it is
        this table's, or there is none)."""
        found = self._table_json(version)
        if found is None or found.get("location") in (None, table_location(self.store)):
            return None
        return str(found["location"])

    def relocate(self) -> int:
        """Removes every Iceberg object here that names another location: the metadata
        of a table copied or moved from there. Each version's metadata is a function of
        the version and the location, so it is written again for this one (by the
        commit, ``sync``, or ``iceberg_metadata_location``); until then Iceberg readers
        see no version, never another location's rows. Returns the objects removed."""
        here = table_location(self.store)
        stale = [o.path for o in self.store.list(METADATA)
                 if is_ours(o.path) or o.path == VERSION_HINT]
        stale += [o.path for o in self.store.list("deletes")
                  if o.path.endswith(".pos.parquet")]
        _LOG.warning("%s: the Iceberg metadata here was written for another location; "
                     "removing its %d objects to write them for %s", self.store.uri,
                     len(stale), here)
        for path in sorted(stale, key=lambda p: not p.endswith(".metadata.json")):
            self.store.delete(path)
        self._tables.clear()
        self._lists.clear()
        self._delete_files.clear()
        return len(stale)

    # -- writing -------------------------------------------------------------
    def after_commit(self, snapshot: Snapshot) -> None:
        """Queues the metadata of a version that just landed, when the table keeps it.

        The version has landed whatever happens next: metadata that could not
        be written is written by the next ``iceberg_metadata_location`` or
        ``beam-supertable iceberg sync``; until then Iceberg readers see the
        version before.
        """
        if not is_enabled(snapshot):
            return
        if snapshot.version == 0 or self.store.protocol == "memory":
            # Written in line: a new table's (not a hot path, and there to see when
            # `create` returns) and an in-memory store's (no round trip to save, and
            # its filesystem is not safe to list while another thread writes).
            self._write_landed(snapshot)
            return
        background.submit(table_location(self.store), lambda: self._write_landed(snapshot),
                          f"version {snapshot.version} of {self.store.uri}")

    def _write_landed(self, snapshot: Snapshot) -> None:
        try:
            with self._lock:
                # Versions are queued as their commits return, not quite as they
                # landed: the hint never goes back to an earlier one.
                self.write(snapshot, hint=self._hint_at_most(snapshot.version))
        except Exception as exc:  # noqa: BLE001 - the commit landed; say what is missing
            _LOG.warning("%s: version %d landed, but its Iceberg metadata was not written "
                         "(%s: %s); it is written by the next iceberg_metadata_location() or "
                         "`beam-supertable iceberg sync`", self.store.uri, snapshot.version,
                         type(exc).__name__, exc)

    def settle(self) -> None:
        """Returns once the metadata this process queued for the table is written."""
        settle(self.store)

    def needed_by(self, snapshot: Snapshot) -> Set[str]:
        """The Iceberg objects a retained version needs, when the table keeps them."""
        if not is_enabled(snapshot):
            return set()
        with self._settled():
            try:
                # Its writer (maybe another process) may not have written it yet:
                # what it will name must be counted before anything is removed.
                self._ensure(snapshot)
            except Exception as exc:  # noqa: BLE001 - counted from what is there, as before
                _LOG.warning("%s: the Iceberg metadata of version %d could not be checked "
                             "before the vacuum (%s: %s); what is there is kept",
                             self.store.uri, snapshot.version, type(exc).__name__, exc)
            return referenced(self.store, snapshot)

    @staticmethod
    def owns(path: str) -> bool:
        """Whether ``path`` is Iceberg metadata this view writes (vacuum may remove it)."""
        return is_ours(path)

    def after_vacuum(self, latest: Snapshot, retained: List[int]) -> None:
        """The latest metadata file forgets the snapshots vacuum removed."""
        if is_enabled(latest):
            with self._settled():
                self.prune_history(latest, retained)

    def after_tags(self, latest: Snapshot) -> None:
        """The latest metadata file names the table's tags as they are now."""
        if not is_enabled(latest):
            return
        with self._settled():
            self._tables.pop(latest.version, None)
            table = self._table_json(latest.version)
            if table is None:
                self.write(latest, hint=self._hint_at_most(latest.version))
                return
            self._retag(latest.version, table)

    def _retag(self, version: int, table: Dict[str, Any]) -> None:
        """Rewrites the metadata file of ``version`` when its tag refs are stale."""
        tagged = self._with_tags(dict(table))
        if tagged.get("refs") == table.get("refs") and \
                tagged.get("snapshots") == table.get("snapshots"):
            return
        self.store.put(metadata_path(version),
                       json.dumps(tagged, separators=(",", ":")).encode(), durable=False)
        self._remember(self._tables, version, tagged)

    def _with_tags(self, document: Dict[str, Any]) -> Dict[str, Any]:
        return with_tags(document, tag_records.listing(self.store, skip_unreadable=True),
                         self._table_json)

    def _create(self, path: str, data: bytes) -> int:
        """Creates ``path`` unless it exists; returns the size of what is there."""
        try:
            # Not fsynced: derived objects; a torn one fails its reader loudly
            # (metadata JSON is checked here) and is written again once removed.
            self.store.put_if_absent(path, data, durable=False)
            return len(data)
        except AlreadyExists:
            return self.store.head(path).size

    def write(self, snapshot: Snapshot, *, reuse: bool = True, hint: bool = True) -> str:
        """Writes the metadata of ``snapshot``'s version; returns its path.

        Idempotent: what exists already is kept (and its sizes used). The
        metadata of earlier versions that is missing (a writer that crashed
        after its commit) is written first, so the history carries on.

        Args:
            reuse: take the previous version's manifests as they are listed;
                False rebuilds (and rewrites, where missing) every one.
            hint: point ``version-hint.text`` at this version (not for an earlier
                version written on demand: the hint would go back).
        """
        version = snapshot.version
        location = table_location(self.store)
        schema = iceberg_schema(snapshot.schema, snapshot.properties)
        if version > 0 and self.moved_from(version - 1) is not None:
            self.relocate()
            reuse = False
        if reuse:
            self._fill_gap(version)
        previous = self._manifest_list(version - 1) if version > 0 and reuse else None
        reuse = {e["manifest_path"]: e for e in previous or ()}
        manifests: List[Dict[str, Any]] = []
        for part in snapshot.parts:
            path = data_manifest_path(part.path)
            known = reuse.get(f"{location}/{path}")
            if known is None:
                known = self._data_manifest(path, self._read_part(part.path), location, schema,
                                            version)
            manifests.append(known)
        manifests += self._delete_manifests(snapshot, previous, location, schema)
        list_path = manifest_list_path(version)
        if manifests or version > 0:
            self._create(list_path, manifest_list_bytes(list_path, manifests,
                                                        snapshot_id=version,
                                                        sequence_number=version))
            self._remember(self._lists, version, manifests)
        table = self._with_tags(self._table_document(snapshot, schema, location, manifests))
        path = metadata_path(version)
        try:
            self.store.put_if_absent(path, json.dumps(table, separators=(",", ":")).encode(),
                                     durable=False)
            self._remember(self._tables, version, table)
        except AlreadyExists:
            # Written by another writer, maybe before a tag this one saw was made.
            self._tables.pop(version, None)
            there = self._table_json(version)
            if there is not None:
                self._retag(version, there)
        if hint:
            self._write_hint(version)
        return path

    def _fill_gap(self, version: int) -> None:
        """Writes the missing metadata of the versions just before ``version``."""
        missing: List[Snapshot] = []
        earlier = version - 1
        while earlier >= 1 and len(missing) < SNAPSHOTS_KEPT and \
                self._table_json(earlier) is None:
            try:
                snapshot = self._load(earlier)
            except (VersionNotFoundError, FileNotFoundError):
                break   # vacuumed: the history starts after it
            if not is_enabled(snapshot):
                break
            missing.append(snapshot)
            earlier -= 1
        for snapshot in reversed(missing):
            self.write(snapshot, hint=False)

    def repair(self, snapshot: Snapshot) -> str:
        """Checks every object the metadata of ``snapshot``'s version needs, and when one
        is missing or unreadable writes the metadata again; returns its path."""
        with self._settled():
            return self._repair(snapshot)

    def _repair(self, snapshot: Snapshot) -> str:
        version = snapshot.version
        if self.moved_from(version) is not None or \
                (version > 0 and self.moved_from(version - 1) is not None):
            self.relocate()
            return self.write(snapshot, reuse=False)
        try:
            self._ensure(snapshot)
            needed = referenced(self.store, snapshot) - {VERSION_HINT}
            listed = self._readable_list(version) if version > 0 else []
            location = table_location(self.store)
            for manifest in listed:
                needed.add(manifest["manifest_path"][len(location) + 1:])
                if manifest["content"] == DELETES:
                    self._delete_files.pop(manifest["manifest_path"], None)
                    needed.update(f["file_path"][len(location) + 1:] for f in
                                  self._delete_files_of(manifest["manifest_path"], location))
            whole = all(self.store.exists(path) for path in needed)
        except (CorruptManifestError, FileNotFoundError, ValueError, EOFError):
            whole = False
        if whole:
            self._tables.pop(version, None)    # as it is now, not as last seen
            table = self._table_json(version)
            if table is not None:
                self._retag(version, table)
            return metadata_path(version)
        _LOG.warning("%s: the Iceberg metadata of version %d was incomplete; writing it again",
                     self.store.uri, version)
        for path in (metadata_path(version), manifest_list_path(version)):
            self.store.delete(path)
        self._tables.pop(version, None)
        self._lists.pop(version, None)
        return self.write(snapshot, reuse=False)

    def _readable_list(self, version: int) -> List[Dict[str, Any]]:
        self._lists.pop(version, None)
        listed = self._manifest_list(version)
        if listed is None:
            raise FileNotFoundError(manifest_list_path(version))
        return listed

    def prune_history(self, latest: Snapshot, retained: List[int]) -> None:
        """After a vacuum: the latest metadata file lists only the snapshots still kept."""
        table = self._table_json(latest.version)
        if table is None:
            return
        keep = set(retained)
        snapshots = [s for s in table.get("snapshots", ()) if s["snapshot-id"] in keep]
        if len(snapshots) == len(table.get("snapshots", ())):
            return
        pruned = dict(table, snapshots=snapshots)
        pruned["snapshot-log"] = [e for e in table.get("snapshot-log", ())
                                  if e["snapshot-id"] in keep]
        pruned["metadata-log"] = [e for e in table.get("metadata-log", ())
                                  if _version_of_metadata(e["metadata-file"]) in keep]
        if snapshots and "parent-snapshot-id" in snapshots[0]:
            snapshots[0] = {k: v for k, v in snapshots[0].items() if k != "parent-snapshot-id"}
        pruned["refs"] = {name: ref for name, ref in table.get("refs", {}).items()
                          if ref.get("snapshot-id") in keep}
        self.store.put(metadata_path(latest.version),
                       json.dumps(pruned, separators=(",", ":")).encode(), durable=False)
        self._remember(self._tables, latest.version, pruned)

    def _hint_at_most(self, version: int) -> bool:
        """Whether ``version-hint.text`` names ``version`` or an earlier one (or none)."""
        try:
            return int(self.store.get(VERSION_HINT).decode().strip()) <= version
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return True

    def _write_hint(self, version: int) -> None:
        try:
            self.store.put(VERSION_HINT, str(version).encode(), durable=False)
        except Exception as exc:  # noqa: BLE001 - the hint is a hint; v<N> files are the truth
            _LOG.warning("%s: could not update %s to %d: %s", self.store.uri, VERSION_HINT,
                         version, exc)

    def _data_manifest(self, path: str, entries: List[dict], location: str, schema,
                       version: int) -> Dict[str, Any]:
        files = []
        for entry in entries:
            rows = int(entry["rows"])
            lower, upper = schema.bounds(entry)
            counts = {fid: rows for fid, kind in schema.top_level.values() if kind is not None}
            columns = schema.columns_of(entry)   # by field id: renames, drops
            nulls = {columns[c][0]: int(n) for c, n in (entry.get("null_counts") or {}).items()
                     if c in columns and columns[c][1] is not None}
            nulls[schema.top_level["_id"][0]] = 0
            files.append(data_file(content=DATA, path=f"{location}/{entry['path']}", records=rows,
                                   size=int(entry["bytes"]), value_counts=counts,
                                   null_counts=nulls, lower=lower, upper=upper))
        size = self._create(path, manifest_bytes(path, files, content=DATA, snapshot_id=version,
                                                 schema_json=schema.json))
        return manifest_list_entry(f"{location}/{path}", size, content=DATA,
                                   sequence_number=version, snapshot_id=version,
                                   files=len(files), rows=sum(f["record_count"] for f in files))

    def _delete_manifests(self, snapshot: Snapshot, previous: Optional[List[Dict[str, Any]]],
                          location: str, schema) -> List[Dict[str, Any]]:
        """The delete manifests of ``snapshot``: the previous version's, plus one for the new.

        When the previous ones name deletion vectors this version no longer
        holds (an optimize dropped their superfiles), or there are many, all
        live position delete files go into one new manifest instead.
        """
        version = snapshot.version
        live = {f"{location}/{position_deletes_path(p)}": (sid, p)
                for sid, paths in snapshot.deletes.items() for p in paths}
        if not live:
            return []
        kept, covered = [], {}
        for manifest in previous or ():
            if manifest["content"] != DELETES:
                continue
            files = self._delete_files_of(manifest["manifest_path"], location)
            kept.append(manifest)
            covered.update((f["file_path"], f) for f in files)
        stale = set(covered) - set(live)
        new = [path for path in live if path not in covered]
        if not new and not stale and kept:
            return kept
        if stale or len(kept) >= CONSOLIDATE_AFTER:
            out, files = [], [covered[p] for p in sorted(live) if p in covered]
        else:
            out, files = list(kept), []
        entries_by_id = {e["id"]: e for e in snapshot.entries()} if new else {}
        targets = []
        for path in sorted(new):
            superfile_id, dv_path = live[path]
            entry = entries_by_id.get(superfile_id)
            if entry is None:
                raise CorruptManifestError(
                    f"{self.store.uri}: version {version} has deletion vector {dv_path} for "
                    f"superfile {superfile_id}, which the version does not hold")
            targets.append((dv_path, f"{location}/{entry['path']}"))
        if len(targets) > 1:   # one read and one write each: in parallel
            with concurrent.futures.ThreadPoolExecutor(min(8, len(targets))) as pool:
                files += pool.map(lambda t: self._position_file(t[0], t[1], location), targets)
        else:
            files += [self._position_file(dv, data, location) for dv, data in targets]
        path = delete_manifest_path(version, files)
        size = self._create(path, manifest_bytes(path, files, content=DELETES,
                                                 snapshot_id=version, schema_json=schema.json))
        self._delete_files[f"{location}/{path}"] = files
        out.append(manifest_list_entry(f"{location}/{path}", size, content=DELETES,
                                       sequence_number=version, snapshot_id=version,
                                       files=len(files),
                                       rows=sum(f["record_count"] for f in files)))
        return out

    def _delete_files_of(self, manifest_path: str, location: str) -> List[Dict[str, Any]]:
        if manifest_path not in self._delete_files:
            relative = manifest_path[len(location) + 1:]
            records = read_manifest(self.store.get(relative))
            self._delete_files[manifest_path] = [r["data_file"] for r in records]
            while len(self._delete_files) > 4 * CONSOLIDATE_AFTER:
                del self._delete_files[next(iter(self._delete_files))]
        return self._delete_files[manifest_path]

    def _position_file(self, dv_path: str, data_path: str, location: str) -> Dict[str, Any]:
        rows = dv.decode(self.store.get(dv_path), f"{self.store.uri}/{dv_path}")
        table = pa.table([pa.array([data_path] * len(rows), pa.string()),
                          pa.array(rows, pa.int64())], schema=_POSITION_SCHEMA)
        out = io.BytesIO()
        pq.write_table(table, out, compression="zstd", write_statistics=False)
        path = position_deletes_path(dv_path)
        size = self._create(path, out.getvalue())
        bound = {FILE_PATH_ID: data_path.encode("utf-8")}
        return data_file(content=POSITION_DELETES, path=f"{location}/{path}", records=len(rows),
                         size=size, lower=bound, upper=bound)

    def _table_document(self, snapshot: Snapshot, schema, location: str,
                        manifests: List[Dict[str, Any]]) -> Dict[str, Any]:
        version = snapshot.version
        properties = {"schema.name-mapping.default": json.dumps(schema.name_mapping),
                      "format-version": "2", "beam_supertable.version": str(version)}
        key = snapshot.properties.get("primary_key")
        document: Dict[str, Any] = {
            "format-version": 2,
            "table-uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, location)),
            "location": location,
            "last-sequence-number": version,
            "last-updated-ms": _millis(snapshot.commit["timestamp"]),
            "last-column-id": schema.last_column_id,
            "current-schema-id": 0,
            "schemas": [schema.json],
            "default-spec-id": 0,
            "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999,
            "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": properties,
            "snapshots": [],
            "snapshot-log": [],
            "metadata-log": [],
            "refs": {},
        }
        before = self._table_json(version - 1) if version > 1 else None
        # One schema per shape the table has had, by id; each snapshot names its own.
        # An overwrite that changed the schema starts anew (its old snapshots would
        # be read with ids given again from 1).
        fresh = before is None or (snapshot.commit.get("operation") == "overwrite"
                                   and _fields(before) != schema.json["fields"])
        current_json = dict(schema.json, **({"identifier-field-ids": [
            schema.top_level[c][0] for c in key]} if key else {}))
        document["schemas"], schema_id = _schemas([] if fresh else before.get("schemas", []),
                                                  current_json)
        document["current-schema-id"] = schema_id
        if not fresh:
            document["last-column-id"] = max(schema.last_column_id,
                                             int(before.get("last-column-id", 0)))
        if version == 0:
            return document
        history = []
        if not fresh:
            history = [s for s in before.get("snapshots", ())
                       if s.get("snapshot-id", version) < version][-(SNAPSHOTS_KEPT - 1):]
        current = {
            "snapshot-id": version,
            "sequence-number": version,
            "timestamp-ms": _millis(snapshot.commit["timestamp"]),
            "manifest-list": f"{location}/{manifest_list_path(version)}",
            "summary": self._summary(snapshot, manifests),
            "schema-id": schema_id,
        }
        if history:
            current["parent-snapshot-id"] = history[-1]["snapshot-id"]
        snapshots = history + [current]
        document["current-snapshot-id"] = version
        document["snapshots"] = snapshots
        document["snapshot-log"] = [{"snapshot-id": s["snapshot-id"],
                                     "timestamp-ms": s["timestamp-ms"]} for s in snapshots]
        document["metadata-log"] = [
            {"metadata-file": f"{location}/{metadata_path(s['snapshot-id'])}",
             "timestamp-ms": s["timestamp-ms"]} for s in history]
        document["refs"] = {"main": {"snapshot-id": version, "type": "branch"}}
        return document

    @staticmethod
    def _summary(snapshot: Snapshot, manifests: List[Dict[str, Any]]) -> Dict[str, str]:
        operation = snapshot.commit.get("operation", "")
        totals = snapshot.totals
        delete_files = sum(m["added_files_count"] for m in manifests if m["content"] == DELETES)
        return {
            "operation": _OPERATIONS.get(operation, "overwrite" if snapshot.deletes
                                         else "append"),
            "beam_supertable.operation": str(operation),
            "total-records": str(int(totals.get("rows", 0))),
            "total-data-files": str(int(totals.get("superfiles", 0))),
            "total-delete-files": str(delete_files),
            "total-position-deletes": str(int(totals.get("deleted", 0))),
            "total-equality-deletes": "0",
        }


_OURS = re.compile(r"^metadata/(v\d+\.metadata\.json|snap-\d+\.avro|[0-9a-f]{32}-data\.avro"
                   r"|\d+-deletes-[0-9a-f]{16}\.avro)$")


def settle(store: ObjectStore) -> None:
    """Returns once the Iceberg metadata this process queued for the table is written."""
    background.wait(table_location(store))


def is_ours(path: str) -> bool:
    """Whether ``path`` is Iceberg metadata this module writes (vacuum may remove it)."""
    return bool(_OURS.match(path))


def _version_of_metadata(uri: str) -> Optional[int]:
    name = uri.rsplit("/", 1)[-1]
    number = name[1:-len(".metadata.json")] if name.endswith(".metadata.json") else ""
    return int(number) if number.isdigit() else None


def _fields(table: Dict[str, Any]) -> Any:
    schemas = table.get("schemas") or [{}]
    current = table.get("current-schema-id", 0)
    return next((s for s in schemas if s.get("schema-id", 0) == current), schemas[0]).get("fields")


def _schemas(known: List[Dict[str, Any]], current: Dict[str, Any]) -> Tuple[list, int]:
    """The schemas list with ``current`` in it, and its schema id (an equal one's, or new)."""
    for s in known:
        if s.get("fields") == current["fields"] \
                and s.get("identifier-field-ids") == current.get("identifier-field-ids"):
            return list(known), int(s.get("schema-id", 0))
    schema_id = max((int(s.get("schema-id", 0)) for s in known), default=-1) + 1
    return list(known) + [dict(current, **{"schema-id": schema_id})], schema_id


def referenced(store: ObjectStore, snapshot: Snapshot) -> Set[str]:
    """The Iceberg objects a retained version needs (for vacuum)."""
    refs = {metadata_path(snapshot.version), VERSION_HINT}
    if snapshot.version > 0:
        refs.add(manifest_list_path(snapshot.version))
    refs.update(data_manifest_path(p.path) for p in snapshot.parts)
    refs.update(position_deletes_path(p) for paths in snapshot.deletes.values() for p in paths)
    try:
        listed = read_manifest_list(store.get(manifest_list_path(snapshot.version)))
    except FileNotFoundError:
        return refs
    location = table_location(store)
    refs.update(m["manifest_path"][len(location) + 1:] for m in listed
                if m["manifest_path"].startswith(location + "/"))
    return refs
