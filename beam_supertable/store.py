"""One small object-store interface over fsspec, with an atomic create.

Paths passed to an :class:`ObjectStore` are relative to its root (the table
URI). Every backend's ``put_if_absent`` makes the object appear whole or not
at all, or raises :class:`AlreadyExists`:

* local files: write a temporary file, fsync, then ``link()`` it into place
  (``link`` fails if the target exists, and never exposes a partial file);
* ``memory://``: check-and-write under a process-wide lock;
* ``s3://``: a PUT with ``If-None-Match: *`` (s3fs ``mode="create"``).

Other backends have no atomic create known to this module; they are refused
for writing unless the caller promises a single writer (``single_writer``).
"""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from beam_supertable.errors import AlreadyExists, UnsafeBackendError

__all__ = ["ObjectInfo", "ObjectStore"]

_MEMORY_LOCK = threading.Lock()
_ATOMIC_PROTOCOLS = {"file", "local", "memory", "s3", "s3a"}
_LISTING_CACHE_PROTOCOLS = {"s3", "s3a"}


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
    for field in ("mtime", "LastModified", "created", "updated"):
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
        if fsspec.core.split_protocol(uri)[0] in _LISTING_CACHE_PROTOCOLS:
            # s3fs answers info(), exists() and the size probe of cat_file()
            # from any directory listing it cached earlier, and shares that
            # cache between every handle on the same filesystem instance:
            # after one list(), a version another process created since would
            # stay invisible ("no such object"), and a writer that lost a race
            # would never see the winner. Every call here asks the server.
            fs_options["use_listings_cache"] = False
        self.fs, root = fsspec.core.url_to_fs(uri, **fs_options)
        self.root = root.rstrip("/")
        self.protocol = _protocol(self.fs)
        self.single_writer = single_writer
        self._local = isinstance(self.fs, LocalFileSystem)
        self._memory = isinstance(self.fs, MemoryFileSystem)

    def __repr__(self) -> str:
        return f"ObjectStore({self.uri!r})"

    def __reduce__(self):
        # A store travels to Beam workers as its settings, never as live clients.
        return (_rebuild, (self.uri, self.storage_options, self.single_writer))

    @property
    def atomic(self) -> bool:
        return self.protocol in _ATOMIC_PROTOCOLS

    def full(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def check_writable(self) -> None:
        if not self.atomic and not self.single_writer:
            raise UnsafeBackendError(
                f"{self.uri!r}: backend {self.protocol!r} has no atomic create-if-absent, "
                "so concurrent commits could overwrite each other; pass "
                "single_writer=True if only one writer ever touches this table")

    # -- reads -----------------------------------------------------------
    def get(self, path: str) -> bytes:
        """The whole object. Raises FileNotFoundError naming the path."""
        try:
            return self.fs.cat_file(self.full(path))
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{self.uri}: no object {path!r}") from exc

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; a negative ``start`` counts from the end."""
        try:
            if start < 0:
                size = self.head(path).size
                start, end = max(size + start, 0), size if end is None else end
            return self.fs.cat_file(self.full(path), start=start, end=end)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{self.uri}: no object {path!r}") from exc

    def head(self, path: str) -> ObjectInfo:
        try:
            info = self.fs.info(self.full(path))
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{self.uri}: no object {path!r}") from exc
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
            found = self.fs.find(base, detail=True)
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
    def put(self, path: str, data: bytes) -> None:
        """Writes (or overwrites) an object."""
        self.check_writable()
        if self._local:
            self._local_write_then(self.full(path), data, os.replace)
            return
        self.fs.pipe_file(self.full(path), data)

    def put_if_absent(self, path: str, data: bytes) -> None:
        """Creates the object atomically, or raises :class:`AlreadyExists`."""
        self.check_writable()
        full = self.full(path)
        if self._local:
            self._local_write_then(full, data, os.link)
        elif self._memory:
            with _MEMORY_LOCK:
                if self.fs.exists(full):
                    raise AlreadyExists(f"{self.uri}: object {path!r} already exists")
                self.fs.pipe_file(full, data)
        elif self.protocol in ("s3", "s3a"):
            try:
                self.fs.pipe_file(full, data, mode="create")
            except FileExistsError as exc:
                raise AlreadyExists(f"{self.uri}: object {path!r} already exists") from exc
        else:  # single writer promised
            if self.fs.exists(full):
                raise AlreadyExists(f"{self.uri}: object {path!r} already exists")
            self.fs.pipe_file(full, data)

    def delete(self, path: str) -> None:
        """Deletes an object; deleting a missing one is not an error."""
        self.check_writable()
        try:
            self.fs.rm_file(self.full(path))
        except FileNotFoundError:
            pass

    def _local_write_then(self, full: str, data: bytes, place) -> None:
        folder = os.path.dirname(full)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                place(tmp, full)
            except FileExistsError as exc:
                raise AlreadyExists(f"{self.uri}: object {full!r} already exists") from exc
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
