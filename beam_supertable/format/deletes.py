"""Deletion vectors: which rows of a superfile are gone.

A ``deletes/<uuid>.dv`` object is plain binary, little-endian::

    b"STDV"  u32 version (1)  u64 count  u32 row[count] (ascending)

A superfile may have several; a row is deleted if any of them lists it.
"""

from __future__ import annotations

import struct
import uuid

import numpy as np

MAGIC = b"STDV"
VERSION = 1
PREFIX = "deletes"


def encode(rows: np.ndarray) -> bytes:
    rows = np.unique(np.asarray(rows, dtype=np.uint32))
    return MAGIC + struct.pack("<IQ", VERSION, len(rows)) + rows.astype("<u4").tobytes()


def decode(data: bytes, where: str) -> np.ndarray:
    if len(data) < 16 or data[:4] != MAGIC:
        raise ValueError(f"{where}: not a deletion vector")
    version, count = struct.unpack("<IQ", data[4:16])
    if version != VERSION or len(data) != 16 + 4 * count:
        raise ValueError(f"{where}: deletion vector version {version} or size is wrong")
    return np.frombuffer(data, dtype="<u4", offset=16).astype(np.int64)


def new_path() -> str:
    return f"{PREFIX}/{uuid.uuid4().hex}.dv"
