"""Row digests: an order-free 64-bit hash of a table's rows, for commit fingerprints.

``row_digest(table)`` is the sum, modulo 2^64, of one 64-bit hash per row,
so the digest of rows split over several superfiles is the sum of their
digests (``combine``), whatever the split and the row order. A row's hash
mixes its columns' value hashes in schema order:

* null: a constant;
* booleans, integers, floats, dates, times, timestamps, durations: the
  value's bits (floats widened to float64, so ``1.5`` hashes the same in a
  float32 and a float64 column);
* strings and binaries: a polynomial hash of the bytes, mixed with the length;
* lists (fixed-size included): the same polynomial hash over the elements' hashes;
* structs: the children's hashes mixed in field order;
* anything else (decimals, maps, ...): a BLAKE2 hash of the value's ``repr``.

The digest identifies content for idempotency checks: the same rows give the
same digest in any process and on any platform. It is not a cryptographic
hash; it guards against accidents, not against an adversary.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["combine", "row_digest"]

_U = np.uint64
_C1, _C2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)   # splitmix64 finalizer
_P = _U(0x9E3779B97F4A7C15)      # odd multiplier of the polynomial hashes
_NULL = _U(0x6A09E667F3BCC909)
_SEGMENT_VALUES = 1 << 20        # values hashed at once: bounds the temporaries to ~8 MiB each
_KERNEL_BYTES = 4 << 20          # float-list columns of at least this size: compiled


def row_digest(table: Union[pa.Table, pa.RecordBatch]) -> str:
    """The digest of ``table``'s rows, as 16 hex digits."""
    acc = np.full(table.num_rows, _U(table.num_columns), dtype=np.uint64)
    for column in table.columns:
        acc = _mix(acc * _P + _hash_column(column))
    return f"{int(np.sum(_mix(acc), dtype=np.uint64)):016x}"


def combine(digests: Iterable[str]) -> str:
    """The digest of the union of the rows the ``digests`` were taken of."""
    return f"{sum(int(d, 16) for d in digests) % (1 << 64):016x}"


def _hash_column(column: Union[pa.Array, pa.ChunkedArray]) -> np.ndarray:
    # By the whole column's size: a column of many small chunks is as large.
    compiled = column.nbytes >= _KERNEL_BYTES
    if isinstance(column, pa.ChunkedArray):
        parts = [_hash_array(chunk, compiled) for chunk in column.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    return _hash_array(column, compiled)


def _hash_array(arr: pa.Array, compiled: bool = False) -> np.ndarray:
    t = arr.type
    if isinstance(t, pa.ExtensionType):
        return _hash_array(arr.storage)
    if pa.types.is_dictionary(t):
        return _hash_array(arr.dictionary_decode())
    if pa.types.is_null(t):
        return np.full(len(arr), _NULL, dtype=np.uint64)
    if pa.types.is_boolean(t):
        bits = pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(np.uint64)
    elif pa.types.is_integer(t):
        values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
        bits = values.astype(np.uint64) if pa.types.is_unsigned_integer(t) else \
            values.astype(np.int64).view(np.uint64)
    elif pa.types.is_floating(t):
        values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
        bits = values.astype(np.float64).view(np.uint64)
    elif pa.types.is_temporal(t):
        width = pa.int32() if t.bit_width == 32 else pa.int64()
        return _hash_array(arr.view(width))
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        bits = _bytes_hash(arr)
    elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
            and not pa.types.is_map(t):
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(arr) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = arr.flatten()
        if compiled and flat.type in (pa.float32(), pa.float64()) and not flat.null_count:
            from beam_supertable.format.digest_kernel import float_lists  # (numba: on use)

            bits = float_lists(flat.to_numpy(), offsets)
        else:
            bits = _segment_hash(_hash_array(flat), offsets)
    elif pa.types.is_struct(t):
        bits = np.full(len(arr), _U(t.num_fields), dtype=np.uint64)
        for child in arr.flatten():
            bits = _mix(bits * _P + _hash_array(child))
    else:
        bits = np.array([int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=8)
                                        .digest(), "little") for v in arr.to_pylist()],
                        dtype=np.uint64)
    out = _mix(bits)
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = _NULL
    return out


def _bytes_hash(arr: pa.Array) -> np.ndarray:
    """Per value, a polynomial hash of its bytes; offsets honour a sliced array."""
    arr = arr.cast(pa.large_binary())
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None and len(
        buffers[2]) else np.zeros(0, dtype=np.uint8)
    return _segment_hash(data, offsets)


def _segment_hash(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For each ``values[offsets[i]:offsets[i+1]]``: Σ (v_k + 1)·P^k, mixed with the length."""
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.uint64)
    lengths = np.diff(offsets)
    i = 0
    while i < n:
        j = int(np.searchsorted(offsets, offsets[i] + _SEGMENT_VALUES, side="right")) - 1
        j = min(max(j, i + 1), n)
        lo, hi = int(offsets[i]), int(offsets[j])
        if hi > lo:
            lens = lengths[i:j]
            starts = offsets[i:j] - lo
            position = np.arange(hi - lo, dtype=np.int64) - np.repeat(starts, lens)
            contrib = (values[lo:hi].astype(np.uint64) + _U(1)) * _powers(int(lens.max()))[position]
            sums = np.zeros(hi - lo + 1, dtype=np.uint64)
            np.cumsum(contrib, out=sums[1:])
            out[i:j] = sums[starts + lens] - sums[starts]
        i = j
    return out ^ _mix(lengths.astype(np.uint64) + _P)


def _powers(m: int) -> np.ndarray:
    """P^0 .. P^(m-1) modulo 2^64."""
    out = np.ones(max(m, 1), dtype=np.uint64)
    if m > 1:
        np.cumprod(np.full(m - 1, _P, dtype=np.uint64), out=out[1:])
    return out


def _mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise (uint64 arithmetic wraps by design)."""
    x = x ^ (x >> _U(30))
    x = x * _C1
    x = x ^ (x >> _U(27))
    x = x * _C2
    return x ^ (x >> _U(31))
