"""Primary keys: validation, per-superfile key statistics, and finding a write's keys.

A keyed table names its key columns at create (table property
``primary_key``, a list of column names). Every superfile entry of a keyed
table carries key statistics, so finding where a key lives reads the
manifest, not the table::

    "keys": {"min": [v, ...], "max": [v, ...],   # one per key column, or null
             "bloom": "<base64>", "hashes": k,
             "section": [offset, length]}           # optional: the key section

``min``/``max`` are JSON: integers for integer, bool (0/1), date (days or
ms since the epoch, as the column's type stores them) and timestamp (in the
column's unit) columns, strings for string columns, base64 for binary ones,
and null where no range is kept (fixed-size binary).

The bloom filter is a bit array of ``m = 8 × len(bytes)`` bits (bit ``p`` is
bit ``p % 8`` of byte ``p // 8``) with ``k`` probes per key: ``(a + i·b) mod
m`` for ``i < k``, where ``a`` is the low and ``b | 1`` the high 32 bits of
the key's 64-bit hash. The hash is defined here, on the values (not on any
library's hash), so filters written today stay valid:

- ``mix(x)`` is SplitMix64: ``z = x + 0x9E3779B97F4A7C15``,
  ``z = (z ^ z >> 30) · 0xBF58476D1CE4E5B9``, ``z = (z ^ z >> 27) ·
  0x94D049BB133111EB``, ``z ^ z >> 31``, all mod 2^64;
- a column value hashes to ``mix(v)`` for integer-like values ``v`` (two's
  complement), and to ``mix(p ^ mix(len))`` for bytes (UTF-8 for strings),
  where ``p = Σ byte_j · 0x100000001B3^j mod 2^64``;
- a key hashes to ``h = 0; for each key column: h = mix(h ^ value hash)``.

The filter is sized at ``KEY_BLOOM_BITS_PER_KEY`` bits a row (about 1 %
false positives) up to ``KEY_BLOOM_MAX_BYTES``; larger superfiles get fewer
bits a row and a higher false-positive rate. A false positive costs one
read of that superfile's key columns; the key values read decide.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import DuplicateKeyError, SchemaMismatchError

__all__ = [
    "KEY_BLOOM_BITS_PER_KEY", "KEY_BLOOM_MAX_BYTES", "KeyBatch", "check_primary_key",
    "key_hashes", "key_section", "key_stats", "read_key_section",
]

KEY_BLOOM_BITS_PER_KEY = 10
KEY_BLOOM_MAX_BYTES = 128 << 10
KEY_BLOOM_MIN_BYTES = 8
HASH_CHUNK_BYTES = 4 << 20       # bytes hashed per vectorized step (bounds temporaries)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_P = np.uint64(0x100000001B3)
_LOW32 = np.uint64(0xFFFFFFFF)


def _kind(t: pa.DataType) -> Optional[str]:
    """``"int"`` or ``"bytes"`` for the types a key may have; None otherwise."""
    if (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t)):
        return "int"
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
        return "bytes"
    return None


def check_primary_key(uri: str, schema: pa.Schema, primary_key) -> List[str]:
    """The key column names, validated against the user schema.

    Args:
        primary_key: a column name, a sequence of names, or None (no key).

    Raises:
        SchemaMismatchError: a key column that is missing, named twice,
            reserved, or of a type a key cannot have.
    """
    if primary_key is None:
        return []
    if not isinstance(primary_key, (str, list, tuple)):
        # (list() of an int fails with "'int' object is not iterable"; of
        # bytes, it gives numbers: neither names the argument.)
        raise SchemaMismatchError(
            f"{uri}: primary_key must be a column name or a list of them, got {primary_key!r}")
    names = [primary_key] if isinstance(primary_key, str) else list(primary_key)
    for name in names:
        if not isinstance(name, str):
            raise SchemaMismatchError(
                f"{uri}: primary_key must be a column name or a list of them, got {name!r}")
        if name not in schema.names:
            raise SchemaMismatchError(
                f"{uri}: primary key column {name!r} is not in the schema {schema.names}")
        t = schema.field(name).type
        if _kind(t) is None:
            raise SchemaMismatchError(
                f"{uri}: primary key column {name!r} has type {t}; a key column must be an "
                f"integer, bool, date, timestamp, string or binary")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchemaMismatchError(f"{uri}: primary key names {twice} more than once")
    return names


# -- hashing -----------------------------------------------------------------
def _mix(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


def _int_values(arr: pa.Array) -> np.ndarray:
    """Integer-like values as uint64 (two's complement), the form hashed and ranged."""
    t = arr.type
    if pa.types.is_boolean(t):
        arr = arr.cast(pa.int8())
    elif pa.types.is_date32(t):
        arr = arr.cast(pa.int32())
    elif pa.types.is_date64(t) or pa.types.is_timestamp(t):
        arr = arr.cast(pa.int64())
    values = arr.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64:
        return values
    return values.astype(np.int64).view(np.uint64)


def _byte_view(arr: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets) of a string or binary array without nulls."""
    t = arr.type
    n = len(arr)
    if pa.types.is_fixed_size_binary(t):
        w = t.byte_width
        buf = arr.buffers()[1]
        data = np.frombuffer(buf, np.uint8)[arr.offset * w:(arr.offset + n) * w] \
            if buf is not None else np.zeros(0, np.uint8)
        return data, np.arange(n + 1, dtype=np.int64) * w
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    offsets = np.frombuffer(arr.buffers()[1], np.int64 if wide else np.int32)
    offsets = offsets[arr.offset:arr.offset + n + 1].astype(np.int64)
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    data = data[offsets[0]:offsets[-1]]
    return data, offsets - offsets[0]


def _bytes_hashes(arr: pa.Array) -> np.ndarray:
    data, offsets = _byte_view(arr)
    lengths = np.diff(offsets)
    out = np.empty(len(arr), dtype=np.uint64)
    longest = int(lengths.max()) if len(lengths) else 0
    powers = np.full(max(longest, 1), _P, dtype=np.uint64)
    powers[0] = 1
    powers = np.cumprod(powers, dtype=np.uint64)   # P^j mod 2^64
    start = 0
    while start < len(arr):
        # Rows in chunks of about HASH_CHUNK_BYTES bytes (at least one row).
        stop = int(np.searchsorted(offsets, offsets[start] + HASH_CHUNK_BYTES, side="right")) - 1
        stop = min(len(arr), max(stop, start + 1))
        off = offsets[start:stop + 1] - offsets[start]
        chunk = data[offsets[start]:offsets[stop]]
        exps = np.arange(len(chunk), dtype=np.int64) - np.repeat(off[:-1], np.diff(off))
        terms = chunk.astype(np.uint64) * powers[exps]
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(terms, dtype=np.uint64)])
        out[start:stop] = sums[off[1:]] - sums[off[:-1]]
        start = stop
    return _mix(out ^ _mix(lengths.astype(np.uint64)))


def _column_hashes(arr: pa.Array) -> np.ndarray:
    if _kind(arr.type) == "int":
        return _mix(_int_values(arr))
    return _bytes_hashes(arr)


def key_hashes(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """The 64-bit hash of each row's key (see the module docstring)."""
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for name in columns:
        h = _mix(h ^ _column_hashes(table.column(name).combine_chunks()))
    return h


# -- statistics ----------------------------------------------------------------
def _comparable(arr: pa.Array) -> Optional[pa.Array]:
    """The column in the form its range is kept and compared in, or None (no range)."""
    t = arr.type
    if _kind(t) == "int":
        values = _int_values(arr)
        signed = not pa.types.is_unsigned_integer(t)
        return pa.array(values.view(np.int64) if signed else values)
    if pa.types.is_fixed_size_binary(t):
        return None
    return arr


def _to_json(value: Any) -> Any:
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


def _from_json(value: Any, comparable_type: pa.DataType) -> pa.Scalar:
    if pa.types.is_binary(comparable_type) or pa.types.is_large_binary(comparable_type):
        value = base64.b64decode(value)
    return pa.scalar(value, comparable_type)


def _bloom_positions(h: np.ndarray, m: int, k: int) -> np.ndarray:
    """Probe positions, shape ``[k, len(h)]``."""
    a = h & _LOW32
    b = (h >> np.uint64(32)) | np.uint64(1)
    i = np.arange(k, dtype=np.uint64)[:, None]
    return ((a[None, :] + i * b[None, :]) % np.uint64(m)).astype(np.int64)


def bloom_build(h: np.ndarray) -> Tuple[str, int]:
    """A bloom filter over key hashes: (base64 bytes, probes per key)."""
    nbytes = (len(h) * KEY_BLOOM_BITS_PER_KEY + 7) // 8
    nbytes = max(KEY_BLOOM_MIN_BYTES, min(KEY_BLOOM_MAX_BYTES, nbytes))
    m = nbytes * 8
    k = int(min(8, max(1, round(m / max(len(h), 1) * math.log(2)))))
    bits = np.zeros(m, dtype=bool)
    bits[_bloom_positions(h, m, k).ravel()] = True
    return base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode(), k


def bloom_may_contain(data: np.ndarray, k: int, h: np.ndarray) -> np.ndarray:
    """Per hash: False only when the filter (uint8 bytes) rules the key out."""
    pos = _bloom_positions(h, len(data) * 8, k)
    hit = (data[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1
    return hit.all(axis=0).astype(bool)


def key_stats(table: pa.Table, columns: Sequence[str]) -> Dict[str, Any]:
    """The ``keys`` statistics of a superfile's rows (JSON data)."""
    lo, hi = [], []
    for name in columns:
        comparable = _comparable(table.column(name).combine_chunks())
        if comparable is None or len(comparable) == 0:
            lo.append(None)
            hi.append(None)
            continue
        mm = pc.min_max(comparable)
        lo.append(_to_json(mm["min"].as_py()))
        hi.append(_to_json(mm["max"].as_py()))
    bloom, k = bloom_build(key_hashes(table, columns))
    return {"min": lo, "max": hi, "bloom": bloom, "hashes": k}


def key_section(table: pa.Table, columns: Sequence[str]) -> bytes:
    """The ``keys`` superfile section: the key columns in row order, as an Arrow
    IPC stream (one record batch, zstd-compressed buffers)."""
    keys = table.select(list(columns)).combine_chunks()
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, keys.schema, options=options) as writer:
        writer.write_table(keys)
    return sink.getvalue().to_pybytes()


def read_key_section(data: bytes) -> pa.Table:
    """The key columns stored by :func:`key_section`."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


# -- one write's keys ------------------------------------------------------------
class KeyBatch:
    """The keys of one write: duplicates, pruning by superfile statistics, exact matching.

    Args:
        table: the write's rows (conformed to the table schema, keys non-null).
        columns: the table's key columns.
    """

    def __init__(self, table: pa.Table, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        # Positional names: user columns may be called anything, "pos" included.
        arrays = [table.column(c).combine_chunks() for c in self.columns]
        self.keys = pa.table(arrays, names=[f"k{i}" for i in range(len(arrays))])
        self.hashes = key_hashes(table, self.columns)
        self._comparable = [_comparable(a) for a in arrays]
        self._blooms: Dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return self.keys.num_rows

    def describe(self, index: int) -> str:
        """The key of row ``index``, as ``id=7`` or ``(a=1, b='x')``."""
        values = [f"{c}={self.keys.column(i)[index].as_py()!r}" for i, c in enumerate(self.columns)]
        return values[0] if len(values) == 1 else "(" + ", ".join(values) + ")"

    def check_unique(self, uri: str, what: str) -> None:
        """Raises DuplicateKeyError naming the first key given more than once."""
        names = self.keys.column_names
        counted = self.keys.group_by(names).aggregate([([], "count_all")])
        twice = counted.filter(pc.greater(counted["count_all"], 1))
        if twice.num_rows == 0:
            return
        same = np.ones(len(self), dtype=bool)
        for name in names:
            same &= pc.equal(self.keys[name], twice[name][0]).to_numpy(zero_copy_only=False)
        rows = np.where(same)[0]
        raise DuplicateKeyError(
            f"{uri}: key {self.describe(int(rows[0]))} appears {len(rows)} times in this "
            f"{what} (rows {', '.join(str(int(r)) for r in rows[:5])}); keys must be unique "
            f"within one call. Nothing was written.")

    def may_hold(self, entry: dict) -> np.ndarray:
        """Per key: False only when the superfile's key statistics rule it out."""
        stats = entry.get("keys")
        out = np.ones(len(self), dtype=bool)
        if not stats:
            return out  # a superfile without statistics may hold anything
        for i, comparable in enumerate(self._comparable):
            lo, hi = stats["min"][i], stats["max"][i]
            if comparable is None or lo is None:
                continue
            inside = pc.and_(pc.greater_equal(comparable, _from_json(lo, comparable.type)),
                             pc.less_equal(comparable, _from_json(hi, comparable.type)))
            out &= inside.to_numpy(zero_copy_only=False)
            if not out.any():
                return out
        bits = self._blooms.get(entry["id"])
        if bits is None:
            bits = self._blooms[entry["id"]] = np.frombuffer(
                base64.b64decode(stats["bloom"]), dtype=np.uint8)
        which = np.where(out)[0]
        out[which] = bloom_may_contain(bits, int(stats["hashes"]), self.hashes[which])
        return out

    def match(self, stored: pa.Table, which: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Rows of ``stored`` whose key is one of the keys ``which`` of this batch.

        Args:
            stored: key columns (in key order) of a superfile, one row per
                superfile row.
            which: indices of this batch's keys to look for (keys unique).

        Returns:
            ``(stored rows, batch key indices)``, pairwise, stored rows ascending.
        """
        which = np.asarray(which, dtype=np.int64)
        if stored.num_rows == 0 or len(which) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        wanted = self.keys.take(pa.array(which))
        if len(self.columns) == 1:
            found = pc.index_in(stored.column(0).combine_chunks(),
                                value_set=wanted.column(0).combine_chunks())
            valid = found.is_valid().to_numpy(zero_copy_only=False)
            rows = np.where(valid)[0]
            idx = which[found.filter(found.is_valid()).to_numpy(zero_copy_only=False)]
            return rows.astype(np.int64), idx.astype(np.int64)
        names = self.keys.column_names
        left = pa.table([stored.column(i) for i in range(len(names))] +
                        [pa.array(np.arange(stored.num_rows, dtype=np.int64))],
                        names=names + ["pos"])
        right = wanted.append_column("idx", pa.array(which))
        joined = left.join(right, keys=names, join_type="inner")
        rows = joined["pos"].to_numpy()
        idx = joined["idx"].to_numpy()
        order = np.argsort(rows, kind="stable")
        return rows[order].astype(np.int64), idx[order].astype(np.int64)
