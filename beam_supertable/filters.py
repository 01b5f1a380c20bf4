"""Filters: per-superfile column statistics, pruning by them, and row masks."""

from __future__ import annotations

import datetime
import re
from typing import Any, Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds


def column_stats(table: pa.Table) -> Dict[str, List[Any]]:
    """Per-column [min, max] for the columns a filter can prune on (JSON data)."""
    stats = {}
    for name in table.column_names:
        col = table.column(name)
        t = col.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
                or pa.types.is_boolean(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)):
            continue
        if col.null_count == len(col):
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if isinstance(lo, (datetime.datetime, datetime.date)):
            lo, hi = lo.isoformat(), hi.isoformat()
        if isinstance(lo, float) and (lo != lo or hi != hi):
            continue
        stats[name] = [lo, hi]
    return stats


_SIMPLE = re.compile(r"\((\w+) (>|>=|<|<=|==) (-?[\d.]+(?:e-?\d+)?|\"[^\"]*\")\)")


def may_match(entry: dict, expr: pc.Expression) -> bool:
    """False only when the superfile's column min/max rule ``expr`` out.

    Prunes on ``field <op> literal`` (numbers and strings); any other
    expression keeps the superfile: pruning is an optimization, never an error.
    """
    stats = entry.get("stats") or {}
    m = _SIMPLE.fullmatch(str(expr)) if stats else None
    if not m or m.group(1) not in stats:
        return True
    name, op, raw = m.groups()
    value = raw.strip('"') if raw.startswith('"') else float(raw)
    lo, hi = stats[name]
    if isinstance(value, str) != isinstance(lo, str):
        return True
    try:
        return {">": hi > value, ">=": hi >= value, "<": lo < value, "<=": lo <= value,
                "==": lo <= value <= hi}[op]
    except TypeError:
        return True


def mask(table: pa.Table, expr: pc.Expression) -> np.ndarray:
    """The rows of ``table`` for which ``expr`` is true (null counts as false)."""
    result = ds.dataset(table).to_table(columns={"m": expr})["m"]
    return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)
