"""One small object-store interface over fsspec, with an atomic create.

Paths passed to an :class:`ObjectStore` are relative to its root (the table
URI). Every backend's ``put_if_absent`` makes the object appear whole or not
at all, or raises :class:`AlreadyExists`:

* local files: write a temporary file, fsync, then ``link()`` it into place
  (``link`` fails if the target exists, and never exposes a partial file);
* ``memory://``: check-and-write under a process-wide lock;
* ``s3://`` (AWS and S3-compatible servers): a PUT with ``If-None-Match: *``
  (s3fs ``mode="create"``);
* ``gs://``, ``gcs://`` (Google Cloud Storage): an upload with
  ``ifGenerationMatch=0`` (gcsfs ``mode="create"``);
* ``az://``, ``abfs://``, ``abfss://`` (Azure Blob Storage, ADLS Gen2): a PUT
  with ``If-None-Match: *`` (adlfs ``mode="create"``).

Other backends have no atomic create known to this module; they are refused
for writing unless the caller promises a single writer (``single_writer``).

A probe, not trust: a scheme says what a store should do, not what the
server behind an endpoint does (an S3-compatible server or a gateway may
drop ``If-None-Match`` and overwrite). Before the first create a process makes
through an endpoint, it creates one probe object under ``_supertable/`` twice;
a store that accepts the second create is refused (:class:`UnsafeBackendError`)
before it can lose a commit. A refused create is recognised by what the store
answered (``412``, Azure's ``409 BlobAlreadyExists``), whatever exception the
client library made of it; AWS's ``409 ConditionalRequestConflict`` (another
conditional write in flight) is retried.

Requests that fail in transit (refused or reset connections, timeouts, bodies
cut short) are retried here, on top of whatever the client library retries:
``REQUEST_ATTEMPTS`` attempts with jittered backoff, then
:class:`StoreIOError` (a ``ConnectionError``) naming the object. Every
operation is idempotent except the atomic create, whose answer can be lost
after it landed: a retried create then meets its own object. So a create
that finds the object there, or that failed in transit, compares the
object's bytes with its own and succeeds when they are the same; it raises
:class:`AlreadyExists` only for an object with other bytes, and
:class:`StoreIOError` ("may have landed") when it cannot tell.

A ranged read that returns fewer bytes than asked of an object that has
them is a truncated answer, never data: it is retried like a failed request.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import logging
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from beam_supertable.errors import AlreadyExists, StoreIOError, UnsafeBackendError
from beam_supertable.format.backends import (
    LISTING_CACHE_PROTOCOLS, REMOTE_ATOMIC, filesystem, md5_of, refusal)

__all__ = ["ObjectInfo", "ObjectStore"]

_LOG = logging.getLogger(__name__)
_MEMORY_LOCK = threading.Lock()
PROBE_FOLDER = "_supertable/probe"   # the probe's objects, removed as soon as it is done
_PROBED: Dict[Tuple[str, ...], bool] = {}
_PROBE_LOCK = threading.Lock()
_PROBE_LOCKS: Dict[Tuple[str, ...], threading.Lock] = {}
_T = TypeVar("_T")

REQUEST_ATTEMPTS = 4         # per store operation, on top of the client library's retries
RETRY_BASE_S = 0.05          # backoff: 50 ms x 2^attempt, at most 1 s, +-30% jitter
RETRY_CAP_S = 1.0
RETRY_JITTER = 0.30


class _ShortRead(Exception):
    """A ranged read answered fewer bytes than the object holds: a cut-short body."""


@functools.lru_cache(maxsize=None)
def _transient_types() -> Tuple[type, ...]:
    """Exceptions that mean "the request failed in transit", by client library.

    Imported on the first failure only: a local or in-memory store never
    loads botocore or aiohttp.
    """
    found = [ConnectionError, TimeoutError, http.client.IncompleteRead, _ShortRead]
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError, IncompleteReadError
        from botocore.parsers import ResponseParserError
        found += [BotoConnectionError, HTTPClientError, IncompleteReadError,
                  ResponseParserError]
    except ImportError:
        pass
    try:  # a response whose checksum does not match its body: damaged in transit
        from botocore.exceptions import FlexibleChecksumError
        found.append(FlexibleChecksumError)
    except ImportError:
        pass
    try:  # azure-core: a connection refused, reset or timed out, either way
        from azure.core.exceptions import ServiceRequestError, ServiceResponseError
        found += [ServiceRequestError, ServiceResponseError]
    except ImportError:
        pass
    try:
        from aiohttp import ClientError
        found.append(ClientError)
    except ImportError:
        pass
    try:
        from urllib3.exceptions import IncompleteRead, ProtocolError
        found += [IncompleteRead, ProtocolError]
    except ImportError:
        pass
    return tuple(found)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, _transient_types()) and not isinstance(exc, StoreIOError)


def _retry_delay(attempt: int) -> float:
    base = min(RETRY_BASE_S * (2 ** attempt), RETRY_CAP_S)
    return base * (1 + random.uniform(-RETRY_JITTER, RETRY_JITTER))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class ObjectInfo:
    """What ``head`` and ``list`` report of an object."""

    path: str
    size: int
    etag: Optional[str] = None
    mtime: Optional[float] = None


def _protocol(fs) -> str:
    proto = fs.protocol
    return proto[0] if isinstance(proto, (tuple, list)) else proto


def _object_info(path: str, info: Dict[str, Any]) -> ObjectInfo:
    etag = info.get("ETag") or info.get("etag")
    return ObjectInfo(path, int(info.get("size") or 0),
                      etag.strip('"') if isinstance(etag, str) else None, _mtime(info))


def _mtime(info: Dict[str, Any]) -> Optional[float]:
    # fsspec's local and memory stores, s3fs, gcsfs ("updated" too), adlfs.
    for field in ("mtime", "LastModified", "created", "updated", "last_modified"):
        value = info.get(field)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return value.timestamp()
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None


class ObjectStore:
    """Get, ranged get, put, atomic create, head, list and delete under a root.

    Args:
        uri: a local path, ``file://``, ``memory://``, ``s3://`` or any fsspec URL.
        storage_options: passed to fsspec (for s3: ``key``, ``secret``,
            ``client_kwargs={"endpoint_url": ...}`` and so on). For s3 the
            listings cache is always off (``use_listings_cache=False``): a
            cached listing would hide objects other writers created.
        single_writer: allow writing to a backend without an atomic create;
            the caller guarantees no concurrent writer.
    """

    def __init__(self, uri: str, storage_options: Optional[dict] = None, *,
                 single_writer: bool = False) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        fs_options = dict(self.storage_options)
        scheme = fsspec.core.split_protocol(uri)[0]
        if scheme in LISTING_CACHE_PROTOCOLS:
            # s3fs (gcsfs, adlfs) answer info(), exists() and the size probe of
            # cat_file() from any directory listing cached earlier, shared by
            # every handle on the same filesystem instance: after one list(), a
            # version another process created since would stay invisible ("no
            # such object"), and a writer that lost a race would never see the
            # winner. Every call here asks the server.
            fs_options["use_listings_cache"] = False
        self.fs, root = filesystem(uri, scheme, fs_options)
        self.root = root.rstrip("/")
        self.protocol = _protocol(self.fs)
        self.single_writer = single_writer
        self._local = isinstance(self.fs, LocalFileSystem)
        self._memory = isinstance(self.fs, MemoryFileSystem)
        self._endpoint_key: Optional[Tuple[str, ...]] = None   # the probe's, on first create

    def __repr__(self) -> str:
        # Never the storage options: they hold credentials.
        return f"ObjectStore({self.uri!r})"

    def __reduce__(self):
        # A store travels to Beam workers as its settings, never as live clients.
        return (_rebuild, (self.uri, self.storage_options, self.single_writer))

    @property
    def remote(self) -> bool:
        """Whether a request is a network round trip (worth issuing several at once)."""
        return not (self._local or self._memory)

    @property
    def atomic(self) -> bool:
        return self.protocol in ("file", "local", "memory") or self.protocol in REMOTE_ATOMIC

    def full(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def check_writable(self) -> None:
        if not self.atomic and not self.single_writer:
            raise UnsafeBackendError(
                f"{self.uri!r}: backend {self.protocol!r} has no atomic create-if-absent, "
                "so concurrent commits could overwrite each other; pass "
                "single_writer=True if only one writer ever touches this table")

    # -- the probe ---------------------------------------------------------
    def endpoint(self) -> Tuple[str, ...]:
        """What the probe's answer holds for: the backend, its endpoint and the bucket."""
        opts = self.storage_options
        client = opts.get("client_kwargs") or {}
        parts = dict(p.split("=", 1) for p in str(opts.get("connection_string") or "").split(";")
                     if "=" in p)
        # The address requests go to (a gateway's, an emulator's), before any account name.
        where = (client.get("endpoint_url") or opts.get("endpoint_url") or
                 opts.get("account_url") or opts.get("account_host") or
                 parts.get("BlobEndpoint") or opts.get("account_name") or
                 parts.get("AccountName") or "")
        bucket = self.root.split("/", 1)[0]
        return (self.protocol, str(where), bucket)

    def _ensure_probed(self) -> None:
        """Probes this store's endpoint once per process before its first create."""
        key = self._endpoint_key
        if key is None:
            key = self._endpoint_key = self.endpoint()
        if _PROBED.get(key):
            return
        with _PROBE_LOCK:   # one lock per endpoint: a slow store holds up no other
            lock = _PROBE_LOCKS.setdefault(key, threading.Lock())
        with lock:
            if not _PROBED.get(key):
                self.probe()
                _PROBED[key] = True

    def probe(self) -> None:
        """Checks that the store refuses a second create of one object.

        Creates ``_supertable/probe/<uuid>`` twice, with other bytes the second
        time, and removes it: two requests (and a delete) per process and
        endpoint.

        Raises:
            UnsafeBackendError: the store accepted the second create: it
                ignores conditional creates, and racing commits would overwrite
                each other.
        """
        path = f"{PROBE_FOLDER}/{uuid.uuid4().hex}"
        full = self.full(path)
        self._create_remote(path, full, b"probe: first create")
        try:
            accepted = self._second_create(path, full)
        finally:
            try:
                self._request("delete", path, lambda: self.fs.rm_file(full))
            except (OSError, StoreIOError) as exc:
                # A writer allowed to create but not delete (write-once policies,
                # retention): the probe object stays, and vacuum reclaims it.
                _LOG.info("%s: probe object %r not removed (%s)", self.uri, path, exc)
        if accepted:
            raise UnsafeBackendError(
                f"{self.uri}: the store accepted a second create of {path!r}: it ignores "
                "conditional creates (If-None-Match / ifGenerationMatch), so racing commits "
                "would overwrite each other; use a store that honours them, or pass "
                "single_writer=True if only one writer ever writes this table")

    # -- requests ----------------------------------------------------------
    def _pause(self, what: str, path: str, last: BaseException, attempt: int) -> None:
        """Backs off before retry ``attempt + 1`` of a request that failed in transit."""
        delay = _retry_delay(attempt)
        _LOG.info("%s: %s of %r failed in transit (%s); retry %d in %.0f ms",
                  self.uri, what, path, _describe(last), attempt + 1, delay * 1000)
        time.sleep(delay)

    def _request(self, what: str, path: str, call: Callable[[], _T]) -> _T:
        """``call()``, retried when it fails in transit; then StoreIOError.

        Only for idempotent requests (every one but the atomic create).
        """
        for attempt in range(REQUEST_ATTEMPTS):
            try:
                return call()
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"{self.uri}: no object {path!r}") from exc
            except Exception as exc:  # noqa: BLE001 - classified right below
                if not _transient(exc):
                    raise
                last = exc
            if attempt + 1 < REQUEST_ATTEMPTS:
                self._pause(what, path, last, attempt)
        raise StoreIOError(
            f"{self.uri}: {what} of {path!r} failed in transit {REQUEST_ATTEMPTS} times; "
            f"last: {_describe(last)}") from last

    def _info(self, full: str) -> Dict[str, Any]:
        if self._local or self._memory:
            return self.fs.info(full)
        # refresh: a listing leaves directory listings in fsspec's cache, which
        # would hide objects other writers create afterwards (a new version).
        return self.fs.info(full, refresh=True)

    # -- reads -----------------------------------------------------------
    def get(self, path: str) -> bytes:
        """The whole object.

        Raises:
            FileNotFoundError: no such object (the message names it).
            StoreIOError: every attempt failed in transit.
        """
        full = self.full(path)
        return self._request("read", path, lambda: self.fs.cat_file(full))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; a negative ``start`` counts from the end.

        Raises:
            FileNotFoundError: no such object.
            StoreIOError: every attempt failed in transit or came back short.
        """
        if start < 0:
            size = self.head(path).size
            start, end = max(size + start, 0), size if end is None else end
        full = self.full(path)

        def read() -> bytes:
            data = self.fs.cat_file(full, start=start, end=end)
            if end is not None and len(data) < end - start:
                # Short: the object ends early (a legal answer), or the body
                # was cut short in transit (never data). The size tells.
                size = int(self._info(full).get("size") or 0)
                if len(data) < min(end, size) - start:
                    raise _ShortRead(f"bytes [{start}, {end}) of a {size}-byte object "
                                     f"came back as {len(data)} bytes")
            return data

        return self._request("ranged read", path, read)

    def head(self, path: str) -> ObjectInfo:
        full = self.full(path)
        info = self._request("head", path, lambda: self._info(full))
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{self.uri}: {path!r} is a directory, not an object")
        return _object_info(path, info)

    def exists(self, path: str) -> bool:
        try:
            self.head(path)
            return True
        except FileNotFoundError:
            return False

    def list(self, prefix: str = "") -> List[ObjectInfo]:
        """Every object under ``prefix`` (a folder path), recursively."""
        base = self.full(prefix.rstrip("/"))
        try:
            found = self._request("list", prefix, lambda: self.fs.find(base, detail=True))
        except FileNotFoundError:
            return []
        out = []
        cut = len(self.root) + 1
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = name[cut:] if name.startswith(self.root + "/") else name.lstrip("/")[cut - 1:]
            out.append(_object_info(rel, info))
        return sorted(out, key=lambda o: o.path)

    # -- writes ----------------------------------------------------------
    def put(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Writes (or overwrites) an object.

        ``durable=False`` skips a local file's fsyncs: for objects derived from
        others, which are written again when a power loss tears them.
        """
        self.check_writable()
        if self._local:
            self._local_write_then(self.full(path), data, os.replace, durable)
            return
        full = self.full(path)
        self._request("write", path, lambda: self.fs.pipe_file(full, data))

    def put_if_absent(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Creates the object atomically, or raises :class:`AlreadyExists`.

        ``durable=False``: as for :meth:`put`.

        Note:
            On a remote store a create that finds the object holding exactly
            ``data`` succeeds: its own earlier attempt may have landed
            unanswered, and nothing tells that apart from an identical object.
            (Every object this package creates has a fresh name or a unique
            document.)

        Raises:
            AlreadyExists: the object is there with other bytes than ``data``.
            StoreIOError: the create failed in transit and whether it landed
                could not be told; it may have.
        """
        self.check_writable()
        full = self.full(path)
        if self._local:
            self._local_write_then(full, data, os.link, durable)
        elif self._memory:
            with _MEMORY_LOCK:
                if self.fs.exists(full):
                    raise AlreadyExists(f"{self.uri}: object {path!r} already exists")
                self.fs.pipe_file(full, data)
        elif self.protocol in REMOTE_ATOMIC:
            if not self.single_writer:
                self._ensure_probed()
            self._create_remote(path, full, data)
        else:  # single writer promised
            if self.fs.exists(full):
                raise AlreadyExists(f"{self.uri}: object {path!r} already exists")
            self.fs.pipe_file(full, data)

    def _second_create(self, path: str, full: str) -> bool:
        """Whether the store accepts a create of an object it holds (the probe's question)."""
        for attempt in range(REQUEST_ATTEMPTS):
            try:
                self.fs.pipe_file(full, b"probe: second create, must be refused", mode="create")
                return True
            except Exception as exc:  # noqa: BLE001 - classified right below
                answer = refusal(exc)
                if answer == "exists":
                    return False
                if answer != "conflict" and not _transient(exc):
                    raise
                last = exc
            if attempt + 1 < REQUEST_ATTEMPTS:
                self._pause("probe create", path, last, attempt)
        raise StoreIOError(f"{self.uri}: the probe's second create of {path!r} failed "
                           f"{REQUEST_ATTEMPTS} times; last: {_describe(last)}") from last

    def _create_remote(self, path: str, full: str, data: bytes) -> None:
        """A conditional create, retried; a refusal of our own bytes is success.

        A create whose answer was lost (reset, cut short, timed out) may have
        landed; its retry (here, or inside the client library) is then refused
        although the object is ours. Only the object's bytes can tell.
        """
        last: Optional[BaseException] = None
        for attempt in range(REQUEST_ATTEMPTS):
            try:
                self.fs.pipe_file(full, data, mode="create")
                return
            except Exception as exc:  # noqa: BLE001 - classified right below
                answer = refusal(exc)
                if answer == "exists":
                    try:
                        ours = self._holds(path, full, data, after=exc)
                    except FileNotFoundError:
                        ours = False  # there a moment ago, someone else's, deleted since
                    if ours:
                        _LOG.info("%s: create of %r was refused, and the object holds our "
                                  "bytes: an earlier attempt landed", self.uri, path)
                        return
                    raise AlreadyExists(f"{self.uri}: object {path!r} already exists") from exc
                if answer != "conflict" and not _transient(exc):
                    raise
                last = exc
            if attempt + 1 < REQUEST_ATTEMPTS:
                self._pause("create", path, last, attempt)
        try:
            if self._holds(path, full, data, after=last):
                return
        except FileNotFoundError:
            pass
        raise StoreIOError(
            f"{self.uri}: create of {path!r} failed {REQUEST_ATTEMPTS} times (in transit or "
            f"in conflict with another conditional write) and the object is not there with "
            f"our bytes; it may still land. Last: {_describe(last)}") from last

    def _holds(self, path: str, full: str, data: bytes, *, after: BaseException) -> bool:
        """Whether the object holds exactly ``data`` (a head; a read if sizes match)."""
        try:
            info = self._request("head", path, lambda: self._info(full))
            # The store's MD5 of the object, where it keeps one (S3's single-part
            # ETag, GCS's md5Hash, Azure's Content-MD5); else the bytes decide.
            if md5_of(info) == hashlib.md5(data, usedforsecurity=False).hexdigest():
                return True
            if int(info.get("size") or 0) != len(data):
                return False
            return self._request("read", path, lambda: self.fs.cat_file(full)) == data
        except StoreIOError as exc:
            raise StoreIOError(
                f"{self.uri}: create of {path!r} may have landed ({_describe(after)}), and "
                f"checking the object failed too: {exc}") from exc

    def delete(self, path: str) -> None:
        """Deletes an object; deleting a missing one is not an error."""
        self.check_writable()
        full = self.full(path)
        try:
            self._request("delete", path, lambda: self.fs.rm_file(full))
        except FileNotFoundError:
            pass

    def _local_write_then(self, full: str, data: bytes, place, durable: bool = True) -> None:
        folder = os.path.dirname(full)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                place(tmp, full)
            except FileExistsError as exc:
                raise AlreadyExists(f"{self.uri}: object {full!r} already exists") from exc
            if durable:
                _fsync_dir(folder)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _rebuild(uri, storage_options, single_writer):
    return ObjectStore(uri, storage_options, single_writer=single_writer)
