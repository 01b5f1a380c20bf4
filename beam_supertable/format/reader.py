"""Reading one superfile with ranged reads, counting the bytes a query touches."""

from __future__ import annotations

import io
import threading
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable.format.cache import ByteCache
from beam_supertable.format.store import ObjectStore
from beam_supertable.format.superfile import INDEX_KEY, read_header
from beam_supertable.fts.index import TextIndex
from beam_supertable.vector._threads import read_all
from beam_supertable.vector.index import VectorIndex


class IOStats:
    """Bytes and requests a Supertable handle has read (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0
        self.requests = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n
            self.requests += 1

    def snapshot(self) -> Dict[str, int]:
        return {"bytes": self.bytes, "requests": self.requests}


class RangeFile(io.RawIOBase):
    """A read-only file over ``store.get_range``: what pyarrow needs, nothing more."""

    def __init__(self, store: ObjectStore, path: str, size: int, stats: IOStats) -> None:
        self._store, self._path, self._size, self._stats = store, path, size, stats
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self._store.get_range(self._path, self._pos, end)
        self._stats.add(len(data))
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class SuperfileReader:
    """One superfile: its footer, index sections and row groups, read on demand.

    What it keeps after a read (sections, the text index, ``_id`` s, fp32
    vectors by row group) lives in ``cache``, the byte budget of the handle
    that opened it, under keys naming the superfile's path.
    """

    def __init__(self, store: ObjectStore, entry: dict, stats: IOStats,
                 cache: Optional[ByteCache] = None) -> None:
        self.entry = entry
        self._store = store
        self._stats = stats
        self._cache = cache if cache is not None else ByteCache()
        self._path = entry["path"]
        # pre_buffer off: coalescing would fetch the gaps between the column
        # chunks asked for (the vectors between two _id chunks, say).
        self._file = pq.ParquetFile(pa.PythonFile(
            RangeFile(store, entry["path"], entry["bytes"], stats), mode="r"), pre_buffer=False)
        self.metadata = self._file.metadata
        self.header = read_header(self.metadata)
        self._rg_starts = np.zeros(self.metadata.num_row_groups + 1, dtype=np.int64)
        for i in range(self.metadata.num_row_groups):
            self._rg_starts[i + 1] = self._rg_starts[i] + self.metadata.row_group(i).num_rows
        self._vector_index = None
        self._schema = None
        self._threads = threading.local()
        # Reads go out together only where each is a round trip: threads cost more than
        # a local read (and a warm handle's single query starts none).
        self.parallel = store.remote

    def _own_file(self) -> pq.ParquetFile:
        """This thread's file over the superfile (the footer parsed once, shared): reads
        of different row groups go out together, each on a file of its own."""
        found = getattr(self._threads, "file", None)
        if found is None:
            found = self._threads.file = pq.ParquetFile(pa.PythonFile(
                RangeFile(self._store, self._path, self.entry["bytes"], self._stats), mode="r"),
                metadata=self.metadata, pre_buffer=False)
        return found

    def _read_groups(self, groups: Sequence[int], columns: Sequence[str]) -> List[pa.Table]:
        """Row groups, read together from a remote store (see ``read_all``)."""
        return read_all(lambda g: self._own_file().read_row_group(g, columns=list(columns)),
                        groups, self.parallel)

    @property
    def arrow_schema(self) -> pa.Schema:
        # ParquetFile.schema_arrow converts the footer's schema on every call
        # (~60 us): a warm search asks for it once per superfile per query.
        if self._schema is None:
            self._schema = self._file.schema_arrow
        return self._schema

    @property
    def num_rows(self) -> int:
        return self.metadata.num_rows

    @property
    def cache(self) -> ByteCache:
        return self._cache

    @property
    def nbytes(self) -> int:
        """About what this reader object holds: the parsed footer."""
        return int(self.metadata.serialized_size) + self._rg_starts.nbytes

    def cache_key(self, *parts) -> tuple:
        """A key for something of this superfile in the shared cache."""
        return (self._path,) + parts

    def section_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a section, one ranged read."""
        off, length = self.header["sections"][name]
        stop = min(stop, length)
        if stop <= start:
            return b""
        data = self._store.get_range(self.entry["path"], off + start, off + stop)
        self._stats.add(len(data))
        return data

    def section(self, name: str) -> bytes:
        """A whole section, kept in the cache."""
        def load():
            data = self.section_range(name, 0, self.header["sections"][name][1])
            return data, len(data)

        return self._cache.get_or_load(self.cache_key("section", name), load)

    def text_index(self) -> TextIndex:
        def load():
            # Read straight, not through section(): the index's arrays are
            # views of these bytes, so they are charged once, with the index.
            ix = TextIndex(self.section_range("text", 0, self.header["sections"]["text"][1]))
            return ix, ix.nbytes

        return self._cache.get_or_load(self.cache_key("text"), load)

    def vector_index(self):
        if self._vector_index is None:
            self._vector_index = VectorIndex(self)
        return self._vector_index

    def vectors(self, rows: np.ndarray, column: str, metric: str):
        """Loads the fp32 vectors of ``rows`` (by row group, cached); returns a lookup."""
        from beam_supertable.vector.metric import prepare
        g_of = np.searchsorted(self._rg_starts, rows, side="right") - 1
        # (a search's few hits: a set is several times quicker than np.unique)
        groups = sorted(set(g_of.tolist())) if len(rows) <= 4096 else np.unique(g_of).tolist()
        found: Dict[int, np.ndarray] = {}
        missing = []
        for g in groups:
            hit = self._cache.get(self.cache_key("vectors", column, metric, g))
            if hit is None:
                missing.append(g)
            else:
                found[g] = hit
        if missing:
            table = self._file.read_row_groups(missing, columns=[column])
            col = table.column(column).combine_chunks()
            flat = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
            x = prepare(flat.reshape(len(col), -1), metric)
            at = 0
            for g in missing:
                n = int(self._rg_starts[g + 1] - self._rg_starts[g])
                # A copy per group, so an evicted group frees its own memory.
                part = x[at:at + n] if len(missing) == 1 else x[at:at + n].copy()
                found[g] = self._cache.put(self.cache_key("vectors", column, metric, g),
                                           part, part.nbytes)
                at += n
        starts = self._rg_starts

        def lookup(rs: np.ndarray) -> np.ndarray:
            g_of = np.searchsorted(starts, rs, side="right") - 1
            out = np.empty((len(rs), next(iter(found.values())).shape[1]), dtype=np.float32)
            for g in np.unique(g_of):
                m = g_of == g
                out[m] = found[int(g)][rs[m] - starts[g]]
            return out

        return lookup

    def ids(self) -> np.ndarray:
        """The ``_id`` column (8 bytes a row), kept in the cache."""
        def load():
            ids = self._file.read(columns=["_id"]).column(0).to_numpy()
            return ids, ids.nbytes

        return self._cache.get_or_load(self.cache_key("ids"), load)

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The ``_id`` of ``rows``, reading only their row groups (kept by row group).

        A cold query returning only ids reads the row groups of its hits, not
        the whole column (a request per row group of the superfile). When
        the handle holds the whole column (``ids``: a small table held whole
        for search keeps it), the ids are taken from it.
        """
        rows = np.asarray(rows, dtype=np.int64)
        whole = self._cache.get(self.cache_key("ids"))
        if whole is not None:
            return whole[rows]
        g_of = np.searchsorted(self._rg_starts, rows, side="right") - 1
        # (a search's few hits: a set is several times quicker than np.unique)
        groups = sorted(set(g_of.tolist())) if len(rows) <= 4096 else np.unique(g_of).tolist()
        found: Dict[int, np.ndarray] = {}
        missing = []
        for g in groups:
            hit = self._cache.get(self.cache_key("ids", g))
            if hit is None:
                missing.append(g)
            else:
                found[g] = hit
        if missing:
            col = self._file.read_row_groups(missing, columns=["_id"]).column(0).to_numpy()
            at = 0
            for g in missing:
                n = int(self._rg_starts[g + 1] - self._rg_starts[g])
                part = col[at:at + n].copy()
                found[g] = self._cache.put(self.cache_key("ids", g), part, part.nbytes)
                at += n
        if len(groups) == 1:   # (one row group: no masks)
            g = groups[0]
            return found[g][rows - self._rg_starts[g]]
        out = np.empty(len(rows), dtype=np.int64)
        for g in groups:
            m = g_of == g
            out[m] = found[g][rows[m] - self._rg_starts[g]]
        return out

    def take_kept(self, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """``take``, keeping each decoded column of each row group read in the cache.

        For reads that repeat over a warm handle (search results): a hit in a
        row group read before costs an array take, not a Parquet read and
        decode. Values and schema are those of ``take``.
        """
        rows = np.asarray(rows, dtype=np.int64)
        columns = list(columns)
        schema = self.arrow_schema
        if not len(rows):
            return _without_index_key(
                pa.schema([schema.field(c) for c in columns]).empty_table())
        g_of = np.searchsorted(self._rg_starts, rows, side="right") - 1
        # (a search's few hits: a set is several times quicker than np.unique)
        groups = sorted(set(g_of.tolist())) if len(rows) <= 4096 else np.unique(g_of).tolist()
        found: Dict[tuple, pa.Array] = {}
        missing: Dict[int, List[str]] = {}
        for g in groups:
            for c in columns:
                hit = self._cache.get(self.cache_key("column", c, g))
                if hit is None:
                    missing.setdefault(g, []).append(c)
                else:
                    found[(c, g)] = hit
        by_columns: Dict[tuple, List[int]] = {}
        for g, names in missing.items():
            by_columns.setdefault(tuple(names), []).append(g)
        for names, wanted in by_columns.items():
            for g, read in zip(wanted, self._read_groups(wanted, names)):
                for c in names:
                    col = read.column(c).combine_chunks()
                    found[(c, g)] = self._cache.put(self.cache_key("column", c, g), col,
                                                    max(col.nbytes, 64))
        if len(groups) == 1:   # (one row group: the rows' places in it)
            g = groups[0]
            pos = pa.array(rows - self._rg_starts[g])
            arrays = [found[(c, g)].take(pos) for c in columns]
            return pa.Table.from_arrays(arrays,
                                        schema=pa.schema([schema.field(c) for c in columns]))
        # Positions of the rows inside the concatenated row groups.
        offsets = np.zeros(len(groups) + 1, dtype=np.int64)
        for i, g in enumerate(groups):
            offsets[i + 1] = offsets[i] + (self._rg_starts[g + 1] - self._rg_starts[g])
        pos = pa.array(offsets[np.searchsorted(groups, g_of)] + (rows - self._rg_starts[g_of]))
        arrays = [pa.chunked_array([found[(c, g)] for g in groups], schema.field(c).type)
                  .take(pos) for c in columns]
        return pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(c) for c in columns]))

    def row_groups_of(self, rows: np.ndarray) -> np.ndarray:
        return np.unique(np.searchsorted(self._rg_starts, rows, side="right") - 1)

    def take(self, rows: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The given rows (superfile row numbers), in the given order."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            schema = self.arrow_schema
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return _without_index_key(schema.empty_table())
        groups = self.row_groups_of(rows)
        # This thread's file: spans of one superfile may be taken from several threads.
        table = self._own_file().read_row_groups(groups.tolist(),
                                                 columns=list(columns) if columns else None)
        # Map superfile rows to positions inside the concatenated row groups.
        offsets = np.zeros(len(groups) + 1, dtype=np.int64)
        for i, g in enumerate(groups):
            offsets[i + 1] = offsets[i] + (self._rg_starts[g + 1] - self._rg_starts[g])
        g_of = np.searchsorted(self._rg_starts, rows, side="right") - 1
        pos = offsets[np.searchsorted(groups, g_of)] + (rows - self._rg_starts[g_of])
        return _without_index_key(table.take(pa.array(pos)))

    def read(self, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """Every row of the superfile (row positions kept), optionally projected."""
        return _without_index_key(self._file.read(columns=list(columns) if columns else None))


def _without_index_key(table: pa.Table) -> pa.Table:
    # The index header travels in the Arrow schema metadata of every superfile;
    # rows handed to users should carry only their own metadata.
    metadata = table.schema.metadata
    if not metadata or INDEX_KEY not in metadata:
        return table
    rest = {k: v for k, v in metadata.items() if k != INDEX_KEY}
    return table.replace_schema_metadata(rest or None)
