"""A table's changes: a range of versions read back as a retraction changelog.

Each version knows what it changed. Its new superfiles are its insertions (their
rows that are live at that version), the rows its new deletion vectors name are
its retractions, and a superfile a version drops (an overwrite) retracts the rows
it still held. ``optimize`` rewrites rows under their own ``_id`` s and changes
nothing logically, so its versions yield nothing and are not read.

The work is planned as *units*, plain JSON data one worker can read alone: the
insertions of one new superfile, or the retractions in one superfile at one
version. Reading a unit touches that superfile only: the columns asked for of
a new superfile, or the row groups holding the retracted rows (ranged reads),
so the cost follows what the range changed, never the size of either snapshot.
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import SchemaMismatchError, VersionNotFoundError
from beam_supertable.format import deletes as dv
from beam_supertable.format.documents import Snapshot
from beam_supertable.format.expression import expression_columns
from beam_supertable.format.filters import mask, pruned
from beam_supertable.format.schema import ID
from beam_supertable.format.writer import DATA
from beam_supertable.table.handle import TableHandle
from beam_supertable.table.optimize_plan import OPERATION as OPTIMIZE

__all__ = ["CHANGE", "COMMIT_TIMESTAMP", "VERSION", "change_columns", "changes",
           "commit_micros", "consolidate", "plan", "read_unit", "versions_between"]

CHANGE, VERSION, COMMIT_TIMESTAMP = "_change", "_version", "_commit_timestamp"
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def commit_micros(snapshot: Snapshot) -> int:
    """When ``snapshot`` was committed, in µs since the epoch (its commit info's timestamp)."""
    stamp = snapshot.commit.get("timestamp")
    if not stamp:
        return 0
    when = datetime.datetime.fromisoformat(stamp)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return (when - _EPOCH) // datetime.timedelta(microseconds=1)


def change_columns(snapshot: Snapshot, columns: Optional[Sequence[str]]) -> List[str]:
    """The user columns a change row carries: ``columns`` checked, or all of them."""
    names = [n for n in snapshot.schema.names if n != ID]
    if columns is None:
        return names
    if isinstance(columns, str):
        columns = [columns]
    if not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"changes: columns must be a list of column names, got {columns!r}")
    unknown = [c for c in columns if c not in snapshot.schema.names]
    if unknown:
        raise SchemaMismatchError(
            f"changes: unknown column(s) {unknown}; the table has {names}")
    twice = sorted({c for c in columns if list(columns).count(c) > 1})
    if twice:
        raise ValueError(f"changes: column(s) {twice} asked for more than once")
    return [c for c in columns if c != ID]


def check_filter(schema: pa.Schema, filter: Optional[pc.Expression]) -> None:  # noqa: A002
    """Refuses a filter that is not an expression or that the table's columns cannot
    evaluate (an unknown column, a type mismatch), in one line, before anything is read."""
    if filter is None:
        return
    if not isinstance(filter, pc.Expression):
        raise TypeError(f"changes: filter must be a pyarrow.compute.Expression, got "
                        f"{type(filter).__name__}")
    try:
        mask(schema.empty_table(), filter)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        first = str(exc).splitlines()[0]
        raise SchemaMismatchError(f"changes: filter {filter} does not apply to the table's "
                                  f"columns {schema.names}: {first}") from None


def output_schema(table_schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    """The schema of change rows carrying ``names`` of a table of ``table_schema``."""
    return pa.schema([table_schema.field(ID)] + [table_schema.field(n) for n in names]
                     + [pa.field(CHANGE, pa.int8()), pa.field(VERSION, pa.int64()),
                        pa.field(COMMIT_TIMESTAMP, _TIMESTAMP)])


def versions_between(handle: TableHandle, start_version: int,
                     end_version: Optional[int]) -> Tuple[int, int]:
    """``(start, end)`` checked against the table: ``end`` defaults to the latest.

    Raises:
        ValueError: a version that is not an int, or ``start > end``.
        VersionNotFoundError: ``end`` beyond the latest version, or ``start``
            removed by ``vacuum`` (the message names the oldest readable one).
    """
    manifest = handle.snapshot.manifest
    latest = manifest.latest_version()
    end = latest if end_version is None or end_version == "latest" else end_version
    for name, value in (("start_version", start_version), ("end_version", end)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{handle.uri}: changes: {name} must be an int >= 0, got {value!r}")
    if start_version > latest:
        raise VersionNotFoundError(f"{handle.uri}: changes: start_version {start_version} "
                                   f"does not exist yet (the latest version is {latest})")
    if start_version > end:
        raise ValueError(f"{handle.uri}: changes: start_version {start_version} is after "
                         f"end_version {end}")
    if end > latest:
        raise VersionNotFoundError(f"{handle.uri}: changes: end_version {end} does not exist "
                                   f"(the latest version is {latest})")
    return start_version, end


def load(handle: TableHandle, version: int, oldest_hint: Optional[int] = None) -> Snapshot:
    manifest = handle.snapshot.manifest
    if version == handle.version:
        return handle.snapshot
    doc = manifest._try_version(version)
    if doc is None:
        listed = manifest._listed_versions()
        oldest = listed[0] if listed else oldest_hint
        raise VersionNotFoundError(
            f"{handle.uri}: changes: version {version} was removed by vacuum; the oldest "
            f"version still readable is {oldest}")
    return manifest._snapshot(doc)


def _entries_by_id(snapshot: Snapshot, parts: Sequence) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for part in parts:
        for entry in snapshot.manifest.read_part(part.path):
            out[entry["id"]] = entry
    return out


def _superfiles_changed(before: Snapshot, after: Snapshot
                        ) -> Tuple[Dict[str, dict], Dict[str, dict]]:
    """The superfile entries ``after`` added and removed, by id."""
    own = after.commit.get("part")
    added = after.totals.get("superfiles", 0) - before.totals.get("superfiles", 0)
    if own is None and [p.path for p in after.parts] == [p.path for p in before.parts]:
        return {}, {}   # a delete: deletion vectors only
    if isinstance(own, str):
        entries = after.manifest.read_part(own)
        if added == len(entries):   # nothing removed: the commit's own part is the news
            return {e["id"]: e for e in entries}, {}
    # Parts a version shares with its predecessor hold the same entries: only
    # the parts that differ are read (a merged part re-lists old entries).
    old_parts = {p.path for p in before.parts}
    new_parts = {p.path for p in after.parts}
    gained = _entries_by_id(after, [p for p in after.parts if p.path not in old_parts])
    lost = _entries_by_id(before, [p for p in before.parts if p.path not in new_parts])
    return ({k: v for k, v in gained.items() if k not in lost},
            {k: v for k, v in lost.items() if k not in gained})


def version_units(before: Snapshot, after: Snapshot, with_stats: bool = False) -> List[dict]:
    """The units of what ``after`` changed on ``before`` (its direct predecessor);
    ``with_stats``: every unit's entry carries its statistics (to prune by a filter)."""
    if after.commit.get("operation") == OPTIMIZE:
        return []   # a rewrite under the same _ids: no logical change
    if after.schema != before.schema and after.commit.get("operation") == "overwrite":
        # Schema changes (add, drop, rename, widen) read on by field id; an
        # overwrite gives ids anew: its two sides cannot share one schema.
        raise SchemaMismatchError(
            f"changes: version {after.version} changed the table's schema (an overwrite); "
            f"changes on both sides cannot share one schema: read up to version "
            f"{before.version}, then from version {after.version} on (version "
            f"{after.version} itself is a new start: read it with checkout({after.version}))")
    stamp = commit_micros(after)
    gained, lost = _superfiles_changed(before, after)
    units = []
    index: Dict[str, dict] = {}
    store = after.manifest.store

    def find(sid: str) -> dict:
        # A superfile gaining a deletion vector is found by its object, named
        # after its id (``writer``), rather than by reading every part.
        path = f"{DATA}/{sid}.sf.parquet"
        try:
            if with_stats:
                raise FileNotFoundError(path)
            return {"id": sid, "path": path, "bytes": store.head(path).size}
        except FileNotFoundError:
            if not index:
                index.update((e["id"], e) for e in after.entries())
            return index[sid]

    def unit(diff: int, entry: dict, exclude: Sequence[str], take: Sequence[str] = ()) -> dict:
        return {"version": after.version, "timestamp": stamp, "diff": diff, "entry": entry,
                "exclude": list(exclude), "take": list(take)}

    for sid in sorted(lost):
        units.append(unit(-1, lost[sid], before.deletes.get(sid, ())))
    for sid, paths in sorted(after.deletes.items()):
        if sid in gained:
            continue   # a superfile new in this version: its deletions are not retractions
        had = before.deletes.get(sid, [])
        fresh = [p for p in paths if p not in had]
        if fresh:
            units.append(unit(-1, find(sid), had, fresh))
    for sid in sorted(gained):
        units.append(unit(+1, gained[sid], after.deletes.get(sid, ())))
    return units


def plan(handle: TableHandle, start: int, end: int, before: Optional[Snapshot] = None,
         with_stats: bool = False) -> Iterator[Tuple[Snapshot, List[dict]]]:
    """Each version of ``start + 1 … end`` with its units, in version order."""
    before = before or load(handle, start)
    for version in range(start + 1, end + 1):
        after = load(handle, version, oldest_hint=start)
        yield after, version_units(before, after, with_stats)
        before = after


def _rows(handle: TableHandle, paths: Sequence[str]) -> np.ndarray:
    if not paths:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(
        [dv.decode(handle.store.get(p), f"{handle.uri}/{p}") for p in paths]))


def read_unit(handle: TableHandle, unit: dict, table_schema: pa.Schema, names: Sequence[str],
              filter: Optional[pc.Expression] = None) -> pa.Table:  # noqa: A002
    """The change rows of one unit: ``_id``, ``names``, ``_change``, ``_version`` and
    ``_commit_timestamp``, for a table of schema ``table_schema``."""
    entry = unit["entry"]
    wanted = [ID] + [n for n in names if n != ID]
    schema = output_schema(table_schema, wanted[1:])
    if "stats" in entry and not pruned([entry], filter, table_schema):
        return schema.empty_table()
    read = wanted
    if filter is not None:
        named = expression_columns(filter)
        read = None if named is None else wanted + [c for c in dict.fromkeys(named)
                                                    if c not in wanted]
    reader = handle._reader(entry, table_schema)   # by field id, as the range's end names them
    gone = _rows(handle, unit["exclude"])
    try:
        if unit["take"]:
            rows = np.setdiff1d(_rows(handle, unit["take"]), gone)
            table = reader.take(rows, read)
        else:
            table = reader.read(read)
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(
            f"{handle.uri}: changes: a row of version {unit['version']} cannot be given the "
            f"schema of the range's end: {exc}; end the range before the version that "
            f"narrowed the column (a restore)") from None
    if not unit["take"]:
        if len(gone):
            keep = np.ones(table.num_rows, dtype=bool)
            keep[gone] = False
            table = table.filter(pa.array(keep))
    if filter is not None:
        table = table.filter(pa.array(mask(table, filter)))
    n = table.num_rows
    table = table.select(wanted)
    table = table.append_column(schema.field(CHANGE), pa.array(np.full(n, unit["diff"], np.int8)))
    table = table.append_column(schema.field(VERSION),
                                pa.array(np.full(n, unit["version"], np.int64)))
    table = table.append_column(schema.field(COMMIT_TIMESTAMP),
                                pa.array(np.full(n, unit["timestamp"], np.int64)).cast(_TIMESTAMP))
    return table.cast(schema)


def consolidate(table: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Changes that cancel inside the range removed: ``rows(end) − rows(start)``.

    ``table`` is in version order (retractions before insertions within a
    version) and holds every user column. Keyless tables consolidate per
    ``_id`` (an ``_id`` is written once and retracted at most once); keyed
    tables per primary key: the row it held at the start is retracted and the
    row it holds at the end inserted, unless the two are equal.
    """
    if table.num_rows == 0:
        return table
    if not primary_key:
        ids = table.column(ID).to_numpy()
        _, inverse = np.unique(ids, return_inverse=True)
        net = np.zeros(inverse.max() + 1, np.int64)
        np.add.at(net, inverse, table.column(CHANGE).to_numpy().astype(np.int64))
        return table.filter(pa.array(net[inverse] != 0))
    keys = list(zip(*(table.column(c).to_pylist() for c in primary_key)))
    diffs = table.column(CHANGE).to_numpy()
    first: Dict[Any, int] = {}
    last: Dict[Any, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
        last[key] = i
    user = [n for n in table.schema.names if n not in (ID, CHANGE, VERSION, COMMIT_TIMESTAMP)]
    keep = []
    for key, i in first.items():
        j = last[key]
        old = i if diffs[i] < 0 else None
        new = j if diffs[j] > 0 else None
        if old is not None and new is not None and _same(table, user, old, new):
            continue
        keep.extend(x for x in (old, new) if x is not None)
    return table.take(pa.array(sorted(keep), pa.int64()))


def _same(table: pa.Table, names: Sequence[str], i: int, j: int) -> bool:
    rows = table.select(list(names)).take(pa.array([i, j])).to_pylist()
    return _comparable(rows[0]) == _comparable(rows[1])


def _comparable(value: Any) -> Any:
    """``value`` with NaN made equal to itself (a row rewritten as it was is no change)."""
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    return value


def changes(handle: TableHandle, start_version: int, end_version: Optional[int] = None, *,
            columns: Optional[Sequence[str]] = None,
            filter: Optional[pc.Expression] = None,  # noqa: A002
            consolidate_changes: bool = False) -> pa.Table:
    """Every logical change of versions ``start_version + 1 … end_version`` (see
    :meth:`Supertable.changes <beam_supertable.table.supertable.Supertable.changes>`)."""
    if not isinstance(consolidate_changes, bool):
        raise TypeError(f"changes: consolidate must be True or False, got "
                        f"{consolidate_changes!r}")
    start, end = versions_between(handle, start_version, end_version)
    # The rows carry the schema of the range's end (columns added since the
    # start read null in older rows; dropped ones are left out; renamed ones
    # carry their new name).
    first = load(handle, end)
    names = change_columns(first, columns)
    check_filter(first.schema, filter)
    primary_key = list(first.properties.get("primary_key") or []) if consolidate_changes else []
    # Consolidating compares whole rows (keyed) or ids; it reads every user column.
    read = [n for n in first.schema.names if n != ID] if primary_key else names
    tables = [read_unit(handle, unit, first.schema, read, filter)
              for _, units in plan(handle, start, end, None, filter is not None)
              for unit in units]
    schema = output_schema(first.schema, read)
    out = pa.concat_tables([schema.empty_table()] + tables)
    out = out.take(pc.sort_indices(out, [(VERSION, "ascending"), (CHANGE, "ascending")]))
    if consolidate_changes:
        out = consolidate(out, primary_key)
    return out.select([ID] + names + [CHANGE, VERSION, COMMIT_TIMESTAMP])
