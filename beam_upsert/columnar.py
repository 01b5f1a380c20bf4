"""The columnar path: the same upsert over Arrow tables, vectorized.

Column conventions (names configurable):

* commands: ``key`` (any Arrow type that sorts: integers, strings, binary),
  ``value`` (null deletes; any type ``pyarrow.compute.equal`` supports),
  ``offset`` (integers or strings) and ``time`` (``int64`` microseconds since
  the epoch, or any ``timestamp`` type);
* prior snapshot: ``key`` and ``value``, one row per key;
* changes (output): ``key``, ``value``, ``diff`` (``int8``, +1 or -1) and
  ``time`` (``int64`` microseconds), retraction before insertion.

Rows with a null key, offset or time are refused (``invalid``), as the row
API refuses such commands.
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue
from apache_beam.pvalue import PCollection
from apache_beam.transforms import window
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Change, Invalid
from beam_upsert.prepare import INVALID_TAG

__all__ = ["UpsertBatches", "batches_to_changes", "upsert_table", "partition_of"]

DEFAULT_PARTITIONS = 16
_PRIOR_TIME = np.iinfo(np.int64).min
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _normalize(table: pa.Table, names: dict, *, with_time: bool = True) -> pa.Table:
    missing = [names[c] for c in names if names[c] not in table.column_names]
    if missing:
        raise KeyError(
            f"batch lacks column(s) {missing}; it has {table.column_names}")
    columns = {c: table.column(names[c]) for c in names}
    if with_time:
        t = columns["time"]
        if pa.types.is_timestamp(t.type):
            t = pc.cast(pc.cast(t, pa.timestamp("us")), pa.int64())
        elif not pa.types.is_integer(t.type):
            raise TypeError(
                f"column {names['time']!r} must be int64 microseconds or a "
                f"timestamp, got {t.type}")
        columns["time"] = pc.cast(t, pa.int64())
    return pa.table(columns)


def upsert_table(
    commands: pa.Table,
    prior: Optional[pa.Table] = None,
    *,
    resume_at: Union[Timestamp, int, None] = None,
    key: str = "key",
    value: str = "value",
    offset: str = "offset",
    time: str = "time",
) -> pa.Table:
    """Runs the upsert over whole tables in one process.

    Same semantics as :class:`beam_upsert.Upsert` (see DESIGN.md): per key,
    one winner per time (greatest offset), times in ascending order, prior
    values seed keys and emit nothing, commands before ``resume_at`` dropped.

    Args:
        commands: key, value, offset and time columns.
        prior: key and value columns; each key at most once.
        resume_at: a Timestamp, or microseconds since the epoch.

    Returns:
        The changes table ``key, value, diff, time``.
    """
    names = {"key": key, "value": value, "offset": offset, "time": time}
    cmd = _normalize(commands, names)
    if resume_at is not None:
        micros = resume_at.micros if isinstance(resume_at, Timestamp) else int(resume_at)
        cmd = cmd.filter(pc.greater_equal(cmd["time"], micros))
    value_type = cmd.schema.field("value").type
    key_type = cmd.schema.field("key").type
    empty = pa.table({
        "key": pa.array([], key_type), "value": pa.array([], value_type),
        "diff": pa.array([], pa.int8()), "time": pa.array([], pa.int64())})
    if cmd.num_rows == 0:
        return empty
    order = pc.sort_indices(cmd, [("key", "ascending"), ("time", "ascending"),
                                  ("offset", "ascending")])
    cmd = cmd.take(order)
    n = cmd.num_rows
    k = cmd["key"].combine_chunks()
    t = cmd["time"].to_numpy()
    # The last row of each (key, time) run holds the greatest offset: it wins.
    last = np.ones(n, dtype=bool)
    if n > 1:
        same_next = pc.equal(k.slice(1), k.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        last[:-1] = ~(same_next & (t[1:] == t[:-1]))
    winners = pa.table({
        "key": k.filter(pa.array(last)),
        "value": cmd["value"].combine_chunks().filter(pa.array(last)),
        "time": pa.array(t[last]),
        "is_prior": pa.array(np.zeros(int(last.sum()), dtype=bool)),
    })
    if prior is not None and prior.num_rows:
        p = _normalize(prior, {"key": key, "value": value}, with_time=False)
        p = p.filter(pc.is_in(p["key"], value_set=pc.unique(winners["key"])))
        p = p.cast(pa.schema([("key", key_type), ("value", value_type)]))
        winners = pa.concat_tables([winners, pa.table({
            "key": p["key"], "value": p["value"],
            "time": pa.array(np.full(p.num_rows, _PRIOR_TIME, dtype=np.int64)),
            "is_prior": pa.array(np.ones(p.num_rows, dtype=bool)),
        })])
        winners = winners.take(pc.sort_indices(
            winners, [("key", "ascending"), ("time", "ascending")]))
    return _transitions(winners, empty)


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


def partition_of(keys: Union[pa.Array, pa.ChunkedArray], n: int) -> np.ndarray:
    """A deterministic partition in ``[0, n)`` per key, the same in every process."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if pa.types.is_integer(keys.type) or pa.types.is_boolean(keys.type):
        h = pc.cast(keys, pa.int64()).to_numpy(zero_copy_only=False).astype(np.uint64)
    else:
        if not (pa.types.is_string(keys.type) or pa.types.is_binary(keys.type)
                or pa.types.is_large_string(keys.type) or pa.types.is_large_binary(keys.type)):
            keys = pc.cast(keys, pa.string())
        keys = pc.cast(keys, pa.large_binary())
        offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[
            keys.offset: keys.offset + len(keys) + 1]
        data = np.frombuffer(keys.buffers()[2], dtype=np.uint8) if keys.buffers()[2] else np.zeros(0, np.uint8)
        start, stop = offsets[:-1], offsets[1:]
        lengths = stop - start
        used = data[start[0]:stop[-1]].astype(np.uint64) if len(keys) else data.astype(np.uint64)
        pos = np.arange(len(used), dtype=np.int64) - np.repeat(start - start[0], lengths)
        weights = (np.uint64(1099511628211) ** (pos % 29).astype(np.uint64))
        h = np.zeros(len(keys), dtype=np.uint64)
        nonempty = lengths > 0
        if used.size:
            sums = np.add.reduceat(used * weights, (start - start[0])[nonempty])
            h[nonempty] = sums
        h ^= lengths.astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (h * _GOLDEN) >> np.uint64(29)
    return (h % np.uint64(n)).astype(np.int64)


def _as_table(element) -> pa.Table:
    if isinstance(element, pa.RecordBatch):
        return pa.Table.from_batches([element])
    if isinstance(element, pa.Table):
        return element
    raise TypeError(
        f"expected a pyarrow RecordBatch or Table, got {type(element).__name__}")


class _SplitByPartition(beam.DoFn):
    """Refuses bad rows and slices a batch into per-partition tables."""

    def __init__(self, names: dict, n_partitions: int, tag: str, resume_at) -> None:
        self._names = names
        self._n = n_partitions
        self._tag = tag
        self._resume_at = resume_at

    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, element):
        try:
            table = _normalize(_as_table(element), self._names,
                               with_time="time" in self._names)
        except (KeyError, TypeError) as exc:
            self._counters.invalid.inc()
            yield pvalue.TaggedOutput(INVALID_TAG, Invalid(
                element if not isinstance(element, (pa.RecordBatch, pa.Table))
                else f"<batch of {element.num_rows} rows>", str(exc.args[0])))
            return
        required = [c for c in ("key", "offset", "time") if c in self._names]
        bad = None
        for c in required:
            nulls = pc.is_null(table[c])
            bad = nulls if bad is None else pc.or_(bad, nulls)
        if self._tag == "p":
            bad = pc.or_(bad, pc.is_null(table["value"]))
        bad_count = pc.sum(bad).as_py() or 0
        if bad_count:
            self._counters.invalid.inc(bad_count)
            for row in table.filter(bad).to_pylist():
                nulls = [self._names[c] for c in ("key", "offset", "time", "value")
                         if c in row and row[c] is None]
                yield pvalue.TaggedOutput(INVALID_TAG, Invalid(
                    row, f"null in column(s) {nulls}"))
            table = table.filter(pc.invert(bad))
        if self._tag == "c" and self._resume_at is not None:
            keep = pc.greater_equal(table["time"], self._resume_at.micros)
            dropped = table.num_rows - (pc.sum(keep).as_py() or 0)
            if dropped:
                self._counters.dropped_before_resume.inc(dropped)
                table = table.filter(keep)
        elif self._tag == "p":
            self._counters.rehydrated.inc(table.num_rows)
        if table.num_rows == 0:
            return
        parts = partition_of(table["key"], self._n)
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(self._n + 1))
        for pid in range(self._n):
            lo, hi = bounds[pid], bounds[pid + 1]
            if hi > lo:
                # take() copies: a slice would pickle its parent's whole buffers.
                yield pid, (self._tag, table.take(pa.array(order[lo:hi])))


class _ApplyPartition(beam.DoFn):
    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, element):
        _, parts = element
        commands = [t for tag, t in parts if tag == "c"]
        priors = [t for tag, t in parts if tag == "p"]
        if not commands:
            return
        changes = upsert_table(
            pa.concat_tables(commands, promote_options="permissive"),
            pa.concat_tables(priors, promote_options="permissive") if priors else None)
        if changes.num_rows:
            diffs = changes["diff"].to_numpy()
            inserts = int((diffs > 0).sum())
            retracts = int((diffs < 0).sum())
            # Each retraction pairs with an insertion (update) or stands alone
            # (delete); count steps the way the row API does.
            same_step = _paired(changes)
            self._counters.updates.inc(same_step)
            self._counters.inserts.inc(inserts - same_step)
            self._counters.deletes.inc(retracts - same_step)
            for batch in changes.to_batches():
                yield batch


def _paired(changes: pa.Table) -> int:
    n = changes.num_rows
    if n < 2:
        return 0
    k = changes["key"].combine_chunks()
    t = changes["time"].to_numpy()
    d = changes["diff"].to_numpy()
    same = pc.equal(k.slice(1), k.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return int((same & (t[1:] == t[:-1]) & (d[:-1] < 0) & (d[1:] > 0)).sum())


class UpsertBatches(beam.PTransform):
    """The upsert over Arrow batches: bulk change files, vectorized.

    Input elements are ``pyarrow.RecordBatch`` or ``pyarrow.Table`` with the
    columns described in this module's docstring; output elements are
    ``RecordBatch`` es of changes. Commands are hash-partitioned by key into
    ``n_partitions`` groups, each upserted by :func:`upsert_table`.

    Example::

        changes = batches | UpsertBatches(prior=snapshot_batches)
        rows = changes | beam.ParDo(batches_to_changes())

    Note:
        Bounded input only (one grouping, like the ``grouped`` flavor).
    """

    def __init__(
        self,
        *,
        prior: Optional[PCollection] = None,
        resume_at: Union[Timestamp, int, float, None] = None,
        n_partitions: int = DEFAULT_PARTITIONS,
        key: str = "key",
        value: str = "value",
        offset: str = "offset",
        time: str = "time",
        label: Optional[str] = None,
    ) -> None:
        super().__init__(label)
        if not isinstance(n_partitions, int) or n_partitions < 1:
            raise ValueError(
                f"UpsertBatches: n_partitions must be a positive int, got {n_partitions!r}")
        self._prior = prior
        self._resume_at = None if resume_at is None else Timestamp.of(resume_at)
        self._n = n_partitions
        self._names = {"key": key, "value": value, "offset": offset, "time": time}
        self._with_invalid = False

    def with_invalid_output(self) -> "UpsertBatches":
        """Makes the transform return ``UpsertResult(changes, invalid)``."""
        self._with_invalid = True
        return self

    def expand(self, batches: PCollection):
        from beam_upsert.transform import UpsertResult

        split = batches | "Split" >> beam.ParDo(_SplitByPartition(
            self._names, self._n, "c", self._resume_at)).with_outputs(INVALID_TAG, main="parts")
        parts, invalid = [split.parts], [split[INVALID_TAG]]
        if self._prior is not None:
            names = {"key": self._names["key"], "value": self._names["value"]}
            psplit = self._prior | "SplitPrior" >> beam.ParDo(_SplitByPartition(
                names, self._n, "p", None)).with_outputs(INVALID_TAG, main="parts")
            parts.append(psplit.parts)
            invalid.append(psplit[INVALID_TAG])
        changes = (
            tuple(parts) | "Merge" >> beam.Flatten()
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "GroupByPartition" >> beam.GroupByKey()
            | "Apply" >> beam.ParDo(_ApplyPartition()))
        if not self._with_invalid:
            return changes
        return UpsertResult(changes, tuple(invalid) | "Invalid" >> beam.Flatten())

    def display_data(self):
        return {"n_partitions": DisplayDataItem(self._n, label="Partitions")}


class batches_to_changes(beam.DoFn):  # noqa: N801 - reads as a function in pipelines
    """Turns change batches into timestamped :class:`Change` rows."""

    def process(self, batch: pa.RecordBatch) -> Iterable[TimestampedValue]:
        cols = batch.to_pydict()
        for key, value, diff, micros in zip(cols["key"], cols["value"], cols["diff"], cols["time"]):
            yield TimestampedValue(Change(key, value, int(diff)), Timestamp(micros=micros))
