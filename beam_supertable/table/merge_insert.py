"""``merge_insert``: LanceDB's builder of a conditional upsert, as one commit.

``t.merge_insert(on)`` returns a :class:`MergeInsertBuilder`; its clauses
say what happens to

- a source row whose ``on`` columns equal a live target row's
  (``when_matched_update_all(where=...)``: the target row is replaced by the
  source row, only where ``where`` holds; ``where`` is a pyarrow expression
  over ``source.<col>`` and ``target.<col>``);
- a source row matching none (``when_not_matched_insert_all()``: inserted);
- a live target row no source row matches
  (``when_not_matched_by_source_delete(where=...)``: deleted, only where
  ``where``, an expression over the target's columns, holds);

and ``execute(rows)`` applies them as ONE commit (none when nothing
changes), returning a :class:`MergeResult`.

Semantics follow LanceDB's: a matched row failing ``where`` stays as it is
(it does not become "not matched"); a key given twice in the source is
refused; a null in an ``on`` column matches nothing; on a key-less table a
source row matching several target rows replaces each of them. On a keyed
table ``on`` is the primary key (the default); other columns are refused,
since inserting by them could give a key two live rows.

How it commits: the plan (which target rows go, which source rows are
written) is made on the latest version, the rows are uploaded, and the
commit loop re-plans on every base it tries (a :class:`PlannedMutation`);
when a concurrent commit changed the rows to write (a new match, say), the
uploaded superfiles are dropped (orphans ``vacuum`` reclaims) and the
merge starts again on the newer version, so nothing another writer
committed is lost. The common case ``on=pk``, update all without a
condition, insert all, is ``upsert``'s path: keys resolved per base from
the superfiles' key statistics, the rows uploaded once.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import CommitFailedError, SchemaMismatchError
from beam_supertable.format.expression import expression_columns
from beam_supertable.format.filters import mask
from beam_supertable.format.keys import KeyBatch
from beam_supertable.format.manifest import DEFAULT_MAX_RETRIES, Snapshot
from beam_supertable.format.schema import Data, conform
from beam_supertable.table.mutation import Mutation

__all__ = ["MergeInsertBuilder", "MergeResult", "Plan", "PlannedMutation", "live_rows",
           "run_planned"]

_LOG = logging.getLogger(__name__)

Removed = Dict[str, Tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What ``merge_insert(...).execute``, ``update`` (and ``upsert``'s builder) did.

    Attributes:
        num_inserted_rows: source rows inserted.
        num_updated_rows: target rows replaced (by a source row, or updated values).
        num_deleted_rows: target rows deleted (``when_not_matched_by_source_delete``).
        version: the version holding the commit, or the version read when
            nothing changed (then nothing is committed).
    """

    num_inserted_rows: int
    num_updated_rows: int
    num_deleted_rows: int
    version: int


@dataclasses.dataclass
class Plan:
    """One write planned on one base: rows to upload and target rows removed."""

    version: int
    written: bytes                 # what names the uploaded rows (equal plans upload equal rows)
    rows: pa.Table                 # the rows to upload (user columns)
    removed: Removed               # per superfile id: (rows removed, zeros)
    counts: Tuple[int, int, int]   # inserted, updated, deleted

    @property
    def empty(self) -> bool:
        return self.rows.num_rows == 0 and not self.removed


class Replan(Exception):
    """The rows a write uploaded are not what its plan on a newer base writes."""


class PlannedMutation(Mutation):
    """A mutation whose removed rows come from a plan, re-planned on each base."""

    def __init__(self, table: Any, operation: str, planner: Callable[[Snapshot], Plan],
                 plan: Plan, **kwargs) -> None:
        super().__init__(table, operation, base_version=plan.version, **kwargs)
        self._planner = planner
        self.plan = plan

    def live(self, base: Snapshot) -> Removed:
        if base.version != self.plan.version:
            plan = self._planner(base)
            if plan.written != self.plan.written:
                raise Replan()
            self.plan = plan
        return self.plan.removed


def run_planned(table: Any, operation: str, planner: Callable[[Snapshot], Plan], *,
                max_retries: int = DEFAULT_MAX_RETRIES, n_shards: Optional[int] = None,
                conformed_to: Optional[pa.Schema] = None, **kwargs) -> MergeResult:
    """Plans on the latest version, uploads, commits; again from the start when
    a concurrent commit changed what to write (at most ``max_retries`` times)."""
    for _ in range(max(1, max_retries)):
        base = table._manifest.load()
        plan = planner(base)
        if plan.empty and kwargs.get("frontier") is None:
            table._snapshot = base
            return MergeResult(0, 0, 0, base.version)
        entries, stamp = table.write_superfiles(plan.rows, n_shards=n_shards, conformed=True)
        mutation = PlannedMutation(table, operation, planner, plan, **kwargs)
        try:
            version = table.commit_superfiles(entries, mutation, grids=stamp.values(),
                                              max_retries=max_retries)
        except Replan:
            _LOG.info("%s: %s re-planned: a concurrent commit changed the rows it writes",
                      table.uri, operation)
            continue
        return MergeResult(*mutation.plan.counts, version)
    raise CommitFailedError(
        f"{table.uri}: {operation} was re-planned {max_retries} times, concurrent commits "
        f"changing its rows each time; nothing was committed")


def live_rows(table: Any, base: Snapshot, entries: Sequence[dict],
              columns: Optional[Sequence[str]] = None) -> Tuple[pa.Table, np.ndarray, np.ndarray]:
    """The live rows (``columns``, default all user columns) of ``entries`` in
    ``base``, with each row's superfile (index into ``entries``) and row number in it."""
    names = list(columns) if columns is not None else [f.name for f in table.user_schema]
    parts, which, pos = [], [], []
    for i, entry in enumerate(entries):
        gone = table._deleted_rows(entry, base)
        if len(gone) >= entry["rows"]:
            continue
        data = table._reader(entry).read(names).select(names)
        keep = np.ones(data.num_rows, dtype=bool)
        keep[gone] = False
        rows = np.where(keep)[0].astype(np.int64)
        parts.append(data.take(pa.array(rows)) if len(gone) else data)
        which.append(np.full(len(rows), i, np.int64))
        pos.append(rows)
    if not parts:
        empty = pa.schema([table.user_schema.field(n) for n in names]).empty_table()
        return empty, np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (pa.concat_tables(parts), np.concatenate(which), np.concatenate(pos))


def removed_of(entries: Sequence[dict], which: np.ndarray, pos: np.ndarray) -> Removed:
    """``{superfile id: (rows, zeros)}`` of the rows ``(which, pos)``."""
    out: Removed = {}
    for i in np.unique(which):
        rows = np.sort(pos[which == i])
        out[entries[int(i)]["id"]] = (rows, np.zeros(len(rows), np.int64))
    return out


def _names(on: Union[str, Sequence[str], None]) -> Optional[List[str]]:
    if on is None:
        return None
    if isinstance(on, str):
        return [on]
    if not isinstance(on, (list, tuple)) or not all(isinstance(c, str) for c in on):
        raise TypeError(f"merge_insert: on= takes a column name or a list of names, got {on!r}")
    return list(on)


def _check_expression(uri: str, where: Any, what: str) -> Optional[pc.Expression]:
    if where is None or isinstance(where, pc.Expression):
        return where
    raise TypeError(f"{uri}: {what} takes a pyarrow expression such as "
                    f"pc.field('source.ts') > pc.field('target.ts'), got {where!r}")


class MergeInsertBuilder:
    """Built by ``Supertable.merge_insert(on)``; see the module docstring.

    Example::

        result = (t.merge_insert("id")
                  .when_matched_update_all(where=pc.field("source.ts") > pc.field("target.ts"))
                  .when_not_matched_insert_all()
                  .when_not_matched_by_source_delete()
                  .execute(rows))
        result.num_inserted_rows, result.num_updated_rows, result.num_deleted_rows
    """

    def __init__(self, table: Any, on: Union[str, Sequence[str], None] = None) -> None:
        self._table = table
        pk = table.primary_key
        names = _names(on)
        if names is None:
            if not pk:
                raise SchemaMismatchError(
                    f"{table.uri}: merge_insert on a table without a primary key needs "
                    f"on=<column(s)> to match source and target rows")
            names = pk
        unknown = [c for c in names if c not in table.user_schema.names]
        if unknown or not names:
            raise SchemaMismatchError(
                f"{table.uri}: merge_insert on={names!r}: column(s) {unknown} are not in the "
                f"table schema {table.user_schema.names}")
        nested = [c for c in names if pa.types.is_nested(table.user_schema.field(c).type)]
        if nested:
            raise SchemaMismatchError(
                f"{table.uri}: merge_insert on={names!r}: column {nested[0]!r} is "
                f"{table.user_schema.field(nested[0]).type}; rows are matched on scalar columns")
        if pk and sorted(names) != sorted(pk):
            raise SchemaMismatchError(
                f"{table.uri}: merge_insert on={names!r}: a keyed table merges on its primary "
                f"key {pk} (other columns could give a key two live rows)")
        self._on = pk if pk else names
        self._update = False
        self._update_where: Optional[pc.Expression] = None
        self._insert = False
        self._delete = False
        self._delete_where: Optional[pc.Expression] = None

    @property
    def on(self) -> List[str]:
        return list(self._on)

    def when_matched_update_all(self, where: Optional[pc.Expression] = None
                                ) -> "MergeInsertBuilder":
        """Replace matched target rows by their source row (where ``where`` holds:
        an expression over ``source.<col>`` and ``target.<col>``)."""
        self._update = True
        self._update_where = _check_expression(self._table.uri, where, "when_matched_update_all")
        return self

    def when_not_matched_insert_all(self) -> "MergeInsertBuilder":
        """Insert source rows that match no target row."""
        self._insert = True
        return self

    def when_not_matched_by_source_delete(self, where: Optional[pc.Expression] = None
                                          ) -> "MergeInsertBuilder":
        """Delete live target rows no source row matches (where ``where``, an
        expression over the target's columns, holds)."""
        self._delete = True
        self._delete_where = _check_expression(self._table.uri, where,
                                               "when_not_matched_by_source_delete")
        return self

    def _is_upsert(self) -> bool:
        return (bool(self._table.primary_key) and self._update and self._update_where is None
                and self._insert and not self._delete)

    def execute(self, rows: Data, *, token: Optional[str] = None,
                metadata: Optional[Dict[str, Any]] = None, frontier: Optional[int] = None,
                max_retries: int = DEFAULT_MAX_RETRIES, n_shards: Optional[int] = None,
                memory_budget_bytes: Optional[int] = None) -> MergeResult:
        """Applies the clauses to ``rows`` as one commit (none when nothing changes).

        Keywords as for ``Supertable.upsert``; ``memory_budget_bytes`` applies to
        the upsert case only.

        Raises:
            SchemaMismatchError: rows that do not fit the schema.
            DuplicateKeyError: an ``on`` key given twice in ``rows``.
        """
        table = self._table
        if self._is_upsert():
            writer = table._writer
            version = writer.write(rows, "upsert", token=token, metadata=metadata,
                                   frontier=frontier, max_retries=max_retries, n_shards=n_shards,
                                   memory_budget_bytes=memory_budget_bytes)
            replaced = writer.last_removed
            return MergeResult(max(writer.last_rows - replaced, 0), replaced, 0, version)
        vp = table._vector_props()
        source = conform(table.uri, rows, table.user_schema, vp["column"] if vp else None)
        # Key statistics choose superfiles on a keyed table (its keys hold no null).
        keys = KeyBatch(source, self._on) if table.primary_key else None
        _check_unique(table.uri, source, self._on)
        if self._update_where is not None:
            _probe(table.uri, self._update_where, _paired(source.slice(0, 0), source.slice(0, 0)),
                   "when_matched_update_all")
        if self._delete_where is not None:
            _probe(table.uri, self._delete_where, source.slice(0, 0),
                   "when_not_matched_by_source_delete")
        if not (self._update or self._insert or self._delete):
            raise ValueError(f"{table.uri}: merge_insert has no clause; call "
                             f"when_matched_update_all, when_not_matched_insert_all or "
                             f"when_not_matched_by_source_delete before execute")
        return run_planned(table, "merge_insert", lambda base: self._plan(base, source, keys),
                           max_retries=max_retries, n_shards=n_shards, token=token,
                           metadata=metadata,
                           frontier=table._writer.frontier_arg(frontier, token))

    # -- the plan on one base ----------------------------------------------
    def _target_columns(self) -> List[str]:
        """The target columns a plan reads: the written rows come from the
        source, so only ``on`` and what the conditions name (all when the
        conditions cannot be told apart)."""
        names = set(self._on)
        if self._update_where is not None:
            used = expression_columns(self._update_where)
            if used is None:
                return self._table.user_schema.names
            names.update(n[len("target."):] for n in used if n.startswith("target."))
        if self._delete_where is not None:
            used = expression_columns(self._delete_where)
            if used is None:
                return self._table.user_schema.names
            names.update(used)
        return [n for n in self._table.user_schema.names if n in names]

    def _plan(self, base: Snapshot, source: pa.Table, keys: Optional[KeyBatch]) -> Plan:
        table = self._table
        entries = base.entries()
        if not self._delete and keys is not None:
            # Only superfiles whose key statistics may hold a source key.
            entries = [e for e in entries if keys.may_hold(e).any()] if len(keys) else []
        target, which, pos = live_rows(table, base, entries, self._target_columns())
        t_idx, s_idx = _join(target, source, self._on)
        upd = np.zeros(0, np.int64)
        if self._update and len(t_idx):
            ok = np.ones(len(t_idx), dtype=bool)
            if self._update_where is not None:
                ok = mask(_paired(source.take(pa.array(s_idx)), target.take(pa.array(t_idx))),
                          self._update_where)
            upd = np.where(ok)[0]
        matched_s = np.zeros(source.num_rows, dtype=bool)
        matched_s[s_idx] = True
        ins = np.where(~matched_s)[0] if self._insert else np.zeros(0, np.int64)
        gone = np.zeros(0, np.int64)
        if self._delete:
            matched_t = np.zeros(target.num_rows, dtype=bool)
            matched_t[t_idx] = True
            gone = np.where(~matched_t)[0]
            if self._delete_where is not None and len(gone):
                gone = gone[mask(target.take(pa.array(gone)), self._delete_where)]
        written = np.concatenate([s_idx[upd], ins]).astype(np.int64)
        written.sort()
        removed_t = np.concatenate([t_idx[upd], gone]).astype(np.int64)
        return Plan(base.version, written.tobytes(), source.take(pa.array(written)),
                    removed_of(entries, which[removed_t], pos[removed_t]),
                    (len(ins), len(upd), len(gone)))


def _check_unique(uri: str, source: pa.Table, on: Sequence[str]) -> None:
    """A source key given twice (rows with a null in ``on`` aside) is refused, naming it."""
    valid = np.ones(source.num_rows, dtype=bool)
    for c in on:
        valid &= source.column(c).is_valid().to_numpy(zero_copy_only=False)
    KeyBatch(source if valid.all() else source.filter(pa.array(valid)), on).check_unique(
        uri, "merge_insert")


def _join(target: pa.Table, source: pa.Table, on: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Pairs (target row, source row) with equal, non-null ``on`` columns."""
    if target.num_rows == 0 or source.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    names = [f"k{i}" for i in range(len(on))]
    t = pa.table([target.column(c) for c in on] + [pa.array(np.arange(target.num_rows))],
                 names=names + ["t"])
    s = pa.table([source.column(c) for c in on] + [pa.array(np.arange(source.num_rows))],
                 names=names + ["s"])
    joined = t.join(s, keys=names, join_type="inner")
    return (joined.column("t").to_numpy().astype(np.int64),
            joined.column("s").to_numpy().astype(np.int64))


def _paired(source: pa.Table, target: pa.Table) -> pa.Table:
    """``source.<col>`` and ``target.<col>`` side by side, one row per pair."""
    cols = [source.column(c) for c in source.column_names] + \
        [target.column(c) for c in target.column_names]
    return pa.table(cols, names=[f"source.{c}" for c in source.column_names]
                    + [f"target.{c}" for c in target.column_names])


def _probe(uri: str, where: pc.Expression, empty: pa.Table, what: str) -> None:
    """Refuses, before anything is written, a condition naming unknown columns."""
    try:
        mask(empty, where)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        first = str(exc).splitlines()[0]
        raise SchemaMismatchError(
            f"{uri}: {what}(where={where}) cannot be evaluated over the columns "
            f"{empty.column_names}: {first}") from None
