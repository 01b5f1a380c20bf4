"""The columnar upsert kernel: commands and a prior as Arrow tables in, changes out.

No pipeline here: :func:`upsert_table` is the whole rule over one batch of keys;
:mod:`beam_upsert.columnar` spreads it over a pipeline.
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.model import (
    Invalid, KeyState, apply_times, check_key, offset_class, resolve_prior,
    resume_micros, value_order_key)

_log = logging.getLogger(__name__)
_PRIOR_TIME = np.iinfo(np.int64).min
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)





class UpsertTableResult(NamedTuple):
    """What ``upsert_table(..., with_invalid=True)`` returns."""

    changes: pa.Table
    invalid: List[Invalid]


def _arrow_offset_class(t: pa.DataType) -> Optional[tuple]:
    """The row API's offset class of an Arrow offset type, None if it has none."""
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            or pa.types.is_boolean(t)):
        return offset_class(0)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return offset_class("")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return offset_class(b"")
    return None


def _is_key_type(t: pa.DataType) -> bool:
    """Keys must sort and hash (:func:`partition_of`): flat scalar types only."""
    return (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t)
            or pa.types.is_decimal(t) or pa.types.is_temporal(t)
            or _arrow_offset_class(t) in (offset_class(""), offset_class(b"")))


def _normalize(table: pa.Table, names: dict, *, with_time: bool = True) -> pa.Table:
    missing = [names[c] for c in names if names[c] not in table.column_names]
    if missing:
        raise KeyError(
            f"batch lacks column(s) {missing}; it has {table.column_names}")
    columns = {c: table.column(names[c]) for c in names}
    if with_time:
        # Timestamps stay as they are here: a row whose time is not a whole
        # number of microseconds is refused by _refuse_bad_rows, not the batch.
        t = columns["time"]
        if pa.types.is_integer(t.type):
            columns["time"] = pc.cast(t, pa.int64())
        elif not pa.types.is_timestamp(t.type):
            raise TypeError(
                f"column {names['time']!r} must be int64 microseconds or a "
                f"timestamp, got {t.type}")
    if not _is_key_type(columns["key"].type):
        raise TypeError(
            f"column {names['key']!r} must hold keys that sort: integers, strings, "
            f"binary, floats, decimals or times, got {columns['key'].type}")
    if "offset" in columns and _arrow_offset_class(columns["offset"].type) is None:
        raise TypeError(
            f"column {names['offset']!r} must hold offsets that order: integers, "
            f"floats, decimals, booleans, strings or binary, got {columns['offset'].type}")
    return pa.table(columns)


_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}


def _time_micros(column: pa.ChunkedArray) -> Tuple[pa.Array, np.ndarray, str]:
    """Converts a time column to int64 microseconds, row by row.

    Returns the micros, a mask of the rows that do not convert (a nanosecond
    time that is not whole microseconds, or a second or millisecond time
    beyond int64 microseconds), which keep their raw integer, and a reason
    template for them (``{}`` is the raw integer).
    """
    raw = pc.cast(column, pa.int64()).combine_chunks()
    unit = column.type.unit if pa.types.is_timestamp(column.type) else "us"
    if unit == "us":
        return raw, np.zeros(len(raw), dtype=bool), ""
    values = raw.fill_null(0).to_numpy(zero_copy_only=False)
    if unit == "ns":
        bad = values % 1_000 != 0
        micros = values // 1_000
        why = "time {} ns is not a whole number of microseconds"
    else:
        factor = _MICROS_PER_UNIT[unit]
        bad = np.abs(values) > np.iinfo(np.int64).max // factor
        with np.errstate(over="ignore"):
            micros = values * factor
        why = f"time {{}} {unit} does not fit int64 microseconds"
    micros = np.where(bad, values, micros)
    nulls = raw.is_null().to_numpy(zero_copy_only=False)
    return pa.array(micros, pa.int64(), mask=nulls), bad, why


def _refuse_bad_rows(table: pa.Table, names: dict) -> Tuple[pa.Table, List[Invalid]]:
    """Splits off rows the row API would refuse, as :class:`Invalid` rows.

    Commands need a key, an offset (not NaN) and a time in whole
    microseconds; snapshot rows (no ``offset`` column) need a key and a
    value. Float keys must be finite, as :func:`beam_upsert.model.check_key`
    requires. Returns the rows kept, their ``time`` in int64 microseconds.
    """
    is_prior = "offset" not in table.column_names
    required = ("key", "value") if is_prior else ("key", "offset", "time")
    bad = None
    for c in required:
        nulls = pc.is_null(table[c])
        bad = nulls if bad is None else pc.or_(bad, nulls)
    if pa.types.is_floating(table.schema.field("key").type):
        bad = pc.or_(bad, pc.invert(pc.fill_null(pc.is_finite(table["key"]), True)))
    if not is_prior and pa.types.is_floating(table.schema.field("offset").type):
        bad = pc.or_(bad, pc.fill_null(pc.is_nan(table["offset"]), False))
    inexact, why = np.zeros(table.num_rows, dtype=bool), ""
    if not is_prior:
        micros, inexact, why = _time_micros(table["time"])
        table = table.set_column(table.schema.get_field_index("time"), "time", micros)
        bad = pc.or_(bad, pa.array(inexact))
    if not (pc.sum(bad).as_py() or 0):
        return table, []
    invalid = []
    rows = np.flatnonzero(pc.fill_null(bad, False).to_numpy(zero_copy_only=False))
    for i, row in zip(rows, table.filter(bad).to_pylist()):
        nulls = [names[c] for c in required if row[c] is None]
        if nulls:
            reason = f"null in column(s) {nulls}"
        elif check_key(row["key"]) is not None:
            reason = check_key(row["key"])
        elif inexact[i]:
            reason = why.format(row["time"])
        else:
            reason = "offset is NaN, which is not orderable"
        invalid.append(Invalid(row, ("prior: " if is_prior else "") + reason))
    return table.filter(pc.invert(bad)), invalid


def upsert_table(
    commands: pa.Table,
    prior: Optional[pa.Table] = None,
    *,
    resume_at: Union[Timestamp, int, None] = None,
    key: str = "key",
    value: str = "value",
    offset: str = "offset",
    time: str = "time",
    with_invalid: bool = False,
) -> Union[pa.Table, UpsertTableResult]:
    """Runs the upsert over whole tables in one process.

    Same semantics as :class:`beam_upsert.Upsert` (see DESIGN.md and
    :mod:`beam_upsert.model`): per key, one winner per time (greatest offset;
    equal offsets by :func:`beam_upsert.model.value_order_key`), times in
    ascending order, prior values seed keys and emit nothing, commands before
    ``resume_at`` dropped.

    Args:
        commands: key, value, offset and time columns (module docstring).
        prior: key and value columns, each key at most once. Default
            ``None``: every key starts without a value.
        resume_at: an apache_beam ``Timestamp``, or an ``int`` of
            microseconds since the epoch (the rule of every entry point;
            floats are refused). Default ``None``: nothing is dropped.
        key: name of the key column (default ``"key"``).
        value: name of the value column (default ``"value"``).
        offset: name of the offset column (default ``"offset"``).
        time: name of the time column (default ``"time"``).
        with_invalid: return ``UpsertTableResult(changes, invalid)`` instead
            of the changes alone. Default ``False``: refused rows (null key,
            offset or time, non-finite float key, NaN offset, sub-microsecond
            time, conflicting snapshot duplicates) are
            logged as a warning and left out, as the row API leaves them out.

    Returns:
        The changes table ``key, value, diff, time``, or an
        :class:`UpsertTableResult` with ``with_invalid``.

    Raises:
        KeyError: a named column is missing.
        TypeError: the time or offset column has a type without an order,
            or ``resume_at`` is neither a Timestamp nor an int.
    """
    micros = resume_micros(resume_at, where="upsert_table")
    names = {"key": key, "value": value, "offset": offset, "time": time}
    cmd, invalid = _refuse_bad_rows(_normalize(commands, names), names)
    if micros is not None:
        cmd = cmd.filter(pc.greater_equal(cmd["time"], micros))
    priors = []
    if prior is not None:
        p_names = {"key": key, "value": value}
        p, bad = _refuse_bad_rows(_normalize(prior, p_names, with_time=False), p_names)
        priors, invalid = [p], invalid + bad
    changes, more = _upsert_tables([cmd], priors)
    invalid += more
    if with_invalid:
        return UpsertTableResult(changes, invalid)
    if invalid:
        _log.warning("upsert_table: refused %d row(s); first: %s (pass with_invalid=True "
                     "to get them)", len(invalid), invalid[0].reason)
    return changes


def _empty_changes(key_type: pa.DataType, value_type: pa.DataType) -> pa.Table:
    return pa.table({
        "key": pa.array([], key_type), "value": pa.array([], value_type),
        "diff": pa.array([], pa.int8()), "time": pa.array([], pa.int64())})


def _upsert_tables(
    cmd_tables: Sequence[pa.Table], prior_tables: Sequence[pa.Table],
) -> Tuple[pa.Table, List[Invalid]]:
    """Upserts normalized, checked command tables on top of snapshot tables.

    Command tables may differ in their offset type (batches of integer and of
    string offsets, say): keys that meet more than one offset type go through
    the row model, which compares the Python values exactly and refuses what
    does not order; the other keys stay columnar.
    """
    cmd_tables, prior_tables, invalid = _agree_on_types(cmd_tables, prior_tables)
    if len({t.schema.field("offset").type for t in cmd_tables}) > 1:
        cmd_tables = [_widen_offsets(t) for t in cmd_tables]
    by_type: dict = {}
    for t in cmd_tables:
        by_type.setdefault(t.schema.field("offset").type, []).append(t)
    tables = [pa.concat_tables(by_type[ty], promote_options="permissive") for ty in sorted(
        by_type, key=lambda ty: (_arrow_offset_class(ty), str(ty)))]
    # Key, value and time types shared by every table (offsets keep their own).
    base = pa.unify_schemas(
        [t.schema.remove(t.schema.get_field_index("offset")) for t in tables]
        + [t.schema for t in prior_tables], promote_options="permissive")
    tables = [t.cast(pa.schema([t.schema.field(c) if c == "offset" else base.field(c)
                                for c in t.column_names])) for t in tables]
    key_type, value_type = base.field("key").type, base.field("value").type
    prior = (pa.concat_tables(prior_tables, promote_options="permissive")
             if prior_tables else None)
    if prior is not None:
        prior = prior.cast(pa.schema([("key", key_type), ("value", value_type)]))
    if not pa.types.is_floating(key_type):
        changes, bad = _upsert_typed(tables, prior, _empty_changes(key_type, value_type))
        return changes, invalid + bad
    # Beam groups keys by their encoded bytes, so -0.0 and 0.0 are two keys
    # while Arrow compares them equal: float keys run as codes of their bits.
    tables = [_set_key(t, _float_key_codes(t["key"])) for t in tables]
    if prior is not None:
        prior = _set_key(prior, _float_key_codes(prior["key"]))
    changes, bad = _upsert_typed(
        tables, prior, _empty_changes(pa.int64(), value_type), key_of=_float_key_of)
    return _set_key(changes, _float_keys_of(changes["key"], key_type)), invalid + bad


def _same(key: Any) -> Any:
    return key


def _set_key(table: pa.Table, keys: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index("key"), "key", keys)


_MAGNITUDE_BITS = np.int64(0x7FFFFFFFFFFFFFFF)


def _float_key_codes(keys: Union[pa.Array, pa.ChunkedArray]) -> pa.Array:
    """int64 codes of float keys: equal exactly when the float64 bits are, and
    ordered as the floats are, with -0.0 just below 0.0.

    Negative floats have the sign bit set; flipping their other bits turns
    "greater magnitude" into "smaller int64". Keys are checked finite and not
    null before they get here.
    """
    bits = pc.cast(keys, pa.float64()).to_numpy().view(np.int64)
    return pa.array(np.where(bits < 0, bits ^ _MAGNITUDE_BITS, bits))


def _float_keys_of(codes: Union[pa.Array, pa.ChunkedArray], key_type: pa.DataType) -> pa.Array:
    """The float keys of :func:`_float_key_codes` codes, as ``key_type``."""
    codes = codes.to_numpy()
    bits = np.where(codes < 0, codes ^ _MAGNITUDE_BITS, codes)
    return pc.cast(pa.array(bits.view(np.float64)), key_type)


def _float_key_of(code: int) -> float:
    """The float key of one :func:`_float_key_codes` code."""
    bits = code ^ 0x7FFFFFFFFFFFFFFF if code < 0 else code
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _upsert_typed(
    tables: Sequence[pa.Table], prior: Optional[pa.Table], empty: pa.Table,
    key_of: Callable[[Any], Any] = _same,
) -> Tuple[pa.Table, List[Invalid]]:
    """Upserts command tables of one key and value type, one table per offset type.

    ``key_of`` turns a key of the tables into the user's key (for the row
    model and the reasons of refused rows).
    """
    if len(tables) == 1:
        return _kernel(tables[0], prior, empty, key_of)
    invalid: List[Invalid] = []
    keys = pa.chunked_array([pc.unique(t["key"]) for t in tables], empty.schema.field("key").type)
    counts = pc.value_counts(keys)
    mixed = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    parts, mixed_rows = [], []
    for t in tables:
        in_mixed = pc.is_in(t["key"], value_set=mixed)
        mixed_rows.append(t.filter(in_mixed))
        changes, bad = _kernel(t.filter(pc.invert(in_mixed)), prior, empty, key_of)
        parts.append(changes)
        invalid += bad
    changes, bad = _row_model(mixed_rows, prior, empty, key_of)
    parts.append(changes)
    invalid += bad
    out = pa.concat_tables(parts)
    return out.take(pc.sort_indices(
        out, [("key", "ascending"), ("time", "ascending"), ("diff", "ascending")])), invalid


_MERGE_ERRORS = (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError)


def _merged_types(schemas: Sequence[pa.Schema]) -> Optional[pa.Schema]:
    try:
        return pa.unify_schemas(list(schemas), promote_options="permissive")
    except _MERGE_ERRORS:
        return None


def _agree_on_types(
    cmd_tables: Sequence[pa.Table], prior_tables: Sequence[pa.Table],
) -> Tuple[List[pa.Table], List[pa.Table], List[Invalid]]:
    """Keeps the tables whose key and value types merge; refuses the others' rows.

    Batches normally agree. When some do not (string values among integer
    ones, say), the command types of the most rows win (ties by type name,
    so not by arrival order), other command types join if they merge with
    them, and snapshot tables must merge with the result.
    """
    def kv(t: pa.Table) -> pa.Schema:
        return pa.schema([t.schema.field("key"), t.schema.field("value")])

    if _merged_types([kv(t) for t in (*cmd_tables, *prior_tables)]) is not None:
        return list(cmd_tables), list(prior_tables), []
    rows: dict = {}
    for t in cmd_tables:
        rows[kv(t)] = rows.get(kv(t), 0) + t.num_rows
    agreed, accepted = None, set()
    for schema in sorted(rows, key=lambda sc: (-rows[sc], str(sc))):
        merged = schema if agreed is None else _merged_types([agreed, schema])
        if merged is not None:
            agreed = merged
            accepted.add(schema)
    for schema in sorted({kv(t) for t in prior_tables}, key=str):
        merged = _merged_types([agreed, schema])
        if merged is not None:
            agreed = merged
            accepted.add(schema)
    keep_cmd = [t for t in cmd_tables if kv(t) in accepted]
    keep_prior = [t for t in prior_tables if kv(t) in accepted]
    refused = [(t, "") for t in cmd_tables if kv(t) not in accepted] + [
        (t, "prior: ") for t in prior_tables if kv(t) not in accepted]
    invalid = []
    for t, prefix in refused:
        reason = (f"{prefix}key type {t.schema.field('key').type} and value type "
                  f"{t.schema.field('value').type} do not merge with "
                  f"{agreed.field('key').type} and {agreed.field('value').type}, the "
                  f"types of most commands")
        invalid += [Invalid(row, reason) for row in t.to_pylist()]
    return keep_cmd, keep_prior, invalid


def _widen_offsets(t: pa.Table) -> pa.Table:
    """Casts offsets to the widest type of their kind, so more batches concatenate.

    Only exact casts: integers to int64, floats to float64, strings and binary
    to their large types. An offset that does not fit (a uint64 beyond
    int64) keeps its type, and its keys take the row model.
    """
    ty = t.schema.field("offset").type
    if pa.types.is_integer(ty):
        target = pa.int64()
    elif pa.types.is_floating(ty):
        target = pa.float64()
    elif pa.types.is_string(ty):
        target = pa.large_string()
    elif pa.types.is_binary(ty):
        target = pa.large_binary()
    else:
        return t
    if ty == target:
        return t
    try:
        offsets = pc.cast(t["offset"], target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return t
    return t.set_column(t.schema.get_field_index("offset"), "offset", offsets)


def _row_model(
    tables: Sequence[pa.Table], prior: Optional[pa.Table], empty: pa.Table,
    key_of: Callable[[Any], Any],
) -> Tuple[pa.Table, List[Invalid]]:
    """The row API's rule over Python values, for keys with mixed offset classes."""
    by_key: dict = {}
    for t in tables:
        cols = [t[c].to_pylist() for c in ("key", "time", "offset", "value")]
        for k, time, off, v in zip(*cols):
            by_key.setdefault(k, []).append((time, off, v))
    if not by_key:
        return empty, []
    priors: dict = {}
    if prior is not None:
        touched = prior.filter(pc.is_in(
            prior["key"], value_set=pa.array(list(by_key), empty.schema.field("key").type)))
        for k, v in zip(touched["key"].to_pylist(), touched["value"].to_pylist()):
            priors.setdefault(k, []).append(v)
    rows, invalid = {"key": [], "value": [], "diff": [], "time": []}, []
    for k, commands in by_key.items():
        user_key = key_of(k)
        seed, conflicts = resolve_prior(user_key, priors.get(k, []))
        invalid += [Invalid({"key": user_key, "value": c.element[1]}, c.reason)
                    for c in conflicts]
        applied = apply_times(KeyState(seed), commands, key=user_key)
        invalid += [Invalid({"key": user_key, "value": v, "offset": off, "time": time}, reason)
                    for time, off, v, reason in applied.invalid]
        for at, old, new in applied.steps:
            for v, diff in ((old, -1), (new, 1)):
                if v is not None:
                    for c, x in zip(("key", "value", "diff", "time"), (k, v, diff, at)):
                        rows[c].append(x)
    return pa.table(rows, schema=empty.schema), invalid


def _run_ends(same_next: np.ndarray, n: int) -> np.ndarray:
    """Index of the last row of each run, given ``same_next[i]``: rows i, i+1 share one."""
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same_next
    return np.flatnonzero(last)


def _adjacent_equal(column: pa.Array) -> np.ndarray:
    n = len(column)
    if n < 2:
        return np.zeros(0, dtype=bool)
    return pc.equal(column.slice(1), column.slice(0, n - 1)).to_numpy(zero_copy_only=False)


def _kernel(cmd: pa.Table, prior: Optional[pa.Table], empty: pa.Table,
            key_of: Callable[[Any], Any] = _same) -> Tuple[pa.Table, List[Invalid]]:
    """The vectorized upsert of command rows whose offsets share one class."""
    if cmd.num_rows == 0:
        return empty, []
    cmd = cmd.take(pc.sort_indices(
        cmd, [("key", "ascending"), ("time", "ascending"), ("offset", "ascending")]))
    n = cmd.num_rows
    k = cmd["key"].combine_chunks()
    t = cmd["time"].to_numpy()
    # The last row of each (key, time) run holds the greatest offset: it wins,
    # unless rows before it tie with it (see _break_ties).
    same_run = _adjacent_equal(k) & (t[1:] == t[:-1])
    win = _run_ends(same_run, n)
    if n > 1:
        tied = same_run & _adjacent_equal(cmd["offset"].combine_chunks())
        if tied[win[win > 0] - 1].any():
            win = _break_ties(win, tied, cmd["value"].combine_chunks())
    take = pa.array(win)
    winners = pa.table({
        "key": k.take(take),
        "value": cmd["value"].combine_chunks().take(take),
        "time": pa.array(t[win]),
        "is_prior": pa.array(np.zeros(len(win), dtype=bool)),
    })
    invalid: List[Invalid] = []
    if prior is not None and prior.num_rows:
        p = prior.filter(pc.is_in(prior["key"], value_set=pc.unique(winners["key"])))
        p, invalid = _dedupe_prior(p, key_of)
        winners = pa.concat_tables([winners, pa.table({
            "key": p["key"], "value": p["value"],
            "time": pa.array(np.full(p.num_rows, _PRIOR_TIME, dtype=np.int64)),
            "is_prior": pa.array(np.ones(p.num_rows, dtype=bool)),
        })])
        winners = winners.take(pc.sort_indices(
            winners, [("key", "ascending"), ("time", "ascending")]))
    return _transitions(winners, empty), invalid


def _break_ties(win: np.ndarray, tied: np.ndarray, values: pa.Array) -> np.ndarray:
    """Re-picks the winners of runs whose greatest offset is shared.

    Equal offsets are rare (a source bug), so this runs in Python, over the
    same Python values and with the same order as the row API.
    """
    win = win.copy()
    for i in np.flatnonzero(win > 0):
        end = win[i]
        if not tied[end - 1]:
            continue
        start = end
        while start > 0 and tied[start - 1]:
            start -= 1
        candidates = values.slice(start, end - start + 1).to_pylist()
        best = max(range(len(candidates)), key=lambda j: value_order_key(candidates[j]))
        win[i] = start + best
    return win


def _dedupe_prior(p: pa.Table, key_of: Callable[[Any], Any]) -> Tuple[pa.Table, List[Invalid]]:
    """Keeps one snapshot row per key as the row API does; reports the others."""
    if p.num_rows < 2:
        return p, []
    p = p.take(pc.sort_indices(p, [("key", "ascending")]))
    keys = p["key"].combine_chunks()
    same = _adjacent_equal(keys)
    if not same.any():
        return p, []
    keep = np.ones(p.num_rows, dtype=bool)
    keep[1:] = ~same
    values = p["value"].combine_chunks()
    invalid = []
    for start in np.flatnonzero(same & ~np.concatenate(([False], same[:-1]))):
        end = start + 1
        while end < len(same) and same[end]:
            end += 1
        key = key_of(keys[start].as_py())
        candidates = values.slice(start, end - start + 1).to_pylist()
        _, conflicts = resolve_prior(key, candidates)
        invalid += [Invalid({"key": key, "value": c.element[1]}, c.reason) for c in conflicts]
        best = max(range(len(candidates)), key=lambda j: value_order_key(candidates[j]))
        keep[start] = False
        keep[start + best] = True
    return p.filter(pa.array(keep)), invalid


def _transitions(rows: pa.Table, empty: pa.Table) -> pa.Table:
    n = rows.num_rows
    k = rows["key"].combine_chunks()
    v = rows["value"].combine_chunks()
    same_prev = np.zeros(n, dtype=bool)
    if n > 1:
        same_prev[1:] = pc.equal(k.slice(1), k.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    shifted = v.take(pa.array(np.maximum(np.arange(n) - 1, 0)))
    old = pc.if_else(pa.array(same_prev), shifted, pa.nulls(n, v.type))
    equal = pc.fill_null(pc.equal(v, old), False)
    both_null = pc.and_(pc.is_null(v), pc.is_null(old))
    is_cmd = pc.invert(rows["is_prior"].combine_chunks())
    changed = pc.and_(is_cmd, pc.invert(pc.or_(equal, both_null)))
    retract = pc.and_(changed, pc.is_valid(old))
    insert = pc.and_(changed, pc.is_valid(v))
    times = rows["time"].combine_chunks()
    parts = []
    for mask, values, diff in ((retract, old, -1), (insert, v, 1)):
        count = pc.sum(mask).as_py() or 0
        if count:
            parts.append(pa.table({
                "key": k.filter(mask), "value": values.filter(mask),
                "diff": pa.array(np.full(count, diff, dtype=np.int8)),
                "time": times.filter(mask)}))
    if not parts:
        return empty
    out = pa.concat_tables(parts)
    return out.take(pc.sort_indices(
        out, [("key", "ascending"), ("time", "ascending"), ("diff", "ascending")]))
