"""Columns written as text, ``name:type``, as the jobs' ``--schema`` and the CLI's
``--column`` take them: ``"id:string,body:string,emb:float32[384]"``.

Types: ``string int64 int32 int16 int8 float64 float32 bool date timestamp
binary`` (and the aliases ``str int float double``) and vectors
``float32[DIM]`` (also ``float16``/``float64``).
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable, List

import pyarrow as pa

__all__ = ["TYPES", "parse_columns", "parse_fields"]

TYPES = {
    "string": pa.string(), "str": pa.string(), "int64": pa.int64(), "int": pa.int64(),
    "int32": pa.int32(), "int16": pa.int16(), "int8": pa.int8(), "float64": pa.float64(),
    "double": pa.float64(), "float": pa.float64(), "float32": pa.float32(), "bool": pa.bool_(),
    "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "binary": pa.binary(),
}
_VECTOR_TYPE = re.compile(r"(float32|float64|float16)\[(\d+)\]")


def parse_fields(parts: Iterable[str], flag: str = "--schema") -> List[pa.Field]:
    """Each ``name:type`` (or comma-separated list of them) as a field.

    Raises:
        ValueError: one line naming ``flag`` and the part or column that is wrong.
    """
    fields = []
    for spec in parts:
        for part in (p.strip() for p in spec.split(",")):
            name, sep, type_name = (s.strip() for s in part.partition(":"))
            vector = _VECTOR_TYPE.fullmatch(type_name)
            if not sep or not name:
                raise ValueError(f"{flag}: {part!r} is not name:type")
            if vector:
                typ = pa.list_(getattr(pa, vector.group(1))(), int(vector.group(2)))
            elif type_name in TYPES:
                typ = TYPES[type_name]
            else:
                close = difflib.get_close_matches(type_name, list(TYPES), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{flag}: column {name!r} has unknown type {type_name!r}{hint}; "
                                 f"use one of {sorted(TYPES)} or float32[DIM]")
            fields.append(pa.field(name, typ))
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"{flag}: repeated column names in {names}")
    return fields


def parse_columns(spec: str, flag: str = "--schema") -> pa.Schema:
    """``"id:string,body:string,emb:float32[384]"`` -> a pyarrow schema."""
    return pa.schema(parse_fields([spec], flag))
