"""A pyarrow ``Expression`` as a small tree of calls, field names and literals.

pyarrow (16 to 25) offers no public accessors for an expression's parts, but
an expression pickles to Arrow's own serialized form: an Arrow IPC file with
one row whose columns are the literals (and function options, as struct
scalars), and whose schema metadata lists the tree in pre-order as ordered
key-value pairs::

    call: greater    field_ref: x    literal: 0    end: greater

(``literal``/``options`` values are column numbers; ``nested_field_ref: n``
is followed by ``n`` ``field_ref`` s). Every part of that path is public: the
pickle protocol, the IPC file reader, and the Arrow C data interface, which
is the one way pyarrow hands out schema metadata in order and with repeated
keys (``Schema.metadata`` is a dict). Anything unexpected yields ``None``:
callers treat an unknown expression as "cannot decide", never as an error.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Call", "Field", "Literal", "Node", "parse"]


@dataclass(frozen=True)
class Field:
    """A top-level column, by name."""

    name: str


@dataclass(frozen=True)
class Literal:
    """A scalar constant (exact: an int64 stays an int64)."""

    value: pa.Scalar


@dataclass(frozen=True)
class Call:
    """A compute function applied to arguments, with its options if any."""

    name: str
    args: Tuple["Node", ...]
    options: Optional[pa.StructScalar] = None


@dataclass(frozen=True)
class Opaque:
    """A part the tree does not model (a nested field reference)."""


Node = Union[Call, Field, Literal, Opaque]


def parse(expr: pc.Expression) -> Optional[Node]:
    """The tree of ``expr``, or None when it cannot be read."""
    try:
        _, (buffer,) = expr.__reduce__()
        reader = pa.ipc.open_file(buffer)
        batch = reader.get_batch(0) if reader.num_record_batches else None
        tokens = _ordered_metadata(reader.schema)
        node, end = _node(tokens, 0, batch)
    except Exception:  # noqa: BLE001 - an unreadable expression only disables pruning
        return None
    return node if end == len(tokens) else None


def _node(tokens: List[Tuple[str, str]], pos: int, batch) -> Tuple[Node, int]:
    key, value = tokens[pos]
    if key == "literal":
        return Literal(batch.column(int(value))[0]), pos + 1
    if key == "field_ref":
        return Field(value), pos + 1
    if key == "nested_field_ref":
        return Opaque(), pos + 1 + int(value)
    if key != "call":
        raise ValueError(f"unexpected {key!r} in a serialized expression")
    args, options, pos = [], None, pos + 1
    while tokens[pos][0] != "end":
        if tokens[pos][0] == "options":
            options = batch.column(int(tokens[pos][1]))[0]
            pos += 1
            continue
        arg, pos = _node(tokens, pos, batch)
        args.append(arg)
    return Call(value, tuple(args), options), pos + 1


class _ArrowSchema(ctypes.Structure):
    # The C data interface's ArrowSchema (arrow/c/abi.h), a stable ABI.
    _fields_ = [("format", ctypes.c_char_p), ("name", ctypes.c_char_p),
                ("metadata", ctypes.c_void_p), ("flags", ctypes.c_int64),
                ("n_children", ctypes.c_int64), ("children", ctypes.c_void_p),
                ("dictionary", ctypes.c_void_p), ("release", ctypes.c_void_p),
                ("private_data", ctypes.c_void_p)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _ordered_metadata(schema: pa.Schema) -> List[Tuple[str, str]]:
    """The schema's key-value metadata in order, repeated keys kept."""
    capsule = schema.__arrow_c_schema__()  # released when the capsule is collected
    metadata = _ArrowSchema.from_address(_capsule_pointer(capsule, b"arrow_schema")).metadata
    if not metadata:
        return []
    # int32 count, then per pair: int32 length + key bytes, int32 length + value bytes.
    pos = metadata
    count = ctypes.c_int32.from_address(pos).value
    pos += 4
    out = []
    for _ in range(count):
        pair = []
        for _ in range(2):
            n = ctypes.c_int32.from_address(pos).value
            pair.append(ctypes.string_at(pos + 4, n).decode())
            pos += 4 + n
        out.append((pair[0], pair[1]))
    return out


def expression_columns(expr: Optional[pc.Expression]) -> Optional[List[str]]:
    """The column names ``expr`` refers to, or None when they cannot be told
    (or ``expr`` is None)."""
    found: List[str] = []

    def walk(node) -> bool:
        if isinstance(node, Field):
            found.append(node.name)
            return True
        if isinstance(node, Call):
            return all(walk(a) for a in node.args)
        return isinstance(node, Literal)

    node = parse(expr) if expr is not None else None
    return found if node is not None and walk(node) else None
