"""The columnar path: the same upsert over Arrow tables, vectorized.

Column conventions (names configurable):

* commands: ``key`` (any Arrow type that sorts: integers, strings, binary),
  ``value`` (null deletes; any type ``pyarrow.compute.equal`` supports),
  ``offset`` (numbers: integers, floats, decimals, booleans; or strings; or
  binary) and ``time`` (``int64`` microseconds since the epoch, or any
  ``timestamp`` type);
* prior snapshot: ``key`` and ``value``, one row per key;
* changes (output): ``key``, ``value``, ``diff`` (``int8``, +1 or -1) and
  ``time`` (``int64`` microseconds), retraction before insertion.

The rules are the row API's (:mod:`beam_upsert.model`), applied to the same
Python values: rows with a null key, offset or time, a NaN or infinite float
key, a NaN offset, or a time that is not whole microseconds are refused
(``invalid``); float keys are one key exactly when their bits are (so -0.0
and 0.0 are two keys, as Beam's grouping by encoded bytes makes them); equal
offsets at one key and time pick their winner by
:func:`beam_upsert.model.value_order_key`; duplicate snapshot keys keep the
same value the row API keeps and report the others. Batches may differ in
their offset type: a key whose commands come with more than one (integers and
strings, or integers and decimals) runs through the row model, which compares
the Python values exactly and refuses the commands whose offsets do not order
against the key's others; every other key stays vectorized.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple, Union

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
from beam_upsert.model import Change, Invalid, resume_micros
from beam_upsert.prepare import INVALID_TAG
from beam_upsert._columnar_kernel import (  # noqa: F401 - the kernel, re-exported
    UpsertTableResult, _GOLDEN, _float_key_codes, _normalize,
    _refuse_bad_rows, _upsert_tables, upsert_table)

__all__ = [
    "UpsertBatches", "UpsertTableResult", "batches_to_changes", "upsert_table", "partition_of"]

DEFAULT_PARTITIONS = 16


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

    def __init__(self, names: dict, n_partitions: int, tag: str,
                 resume_at_micros: Optional[int]) -> None:
        self._names = names
        self._n = n_partitions
        self._tag = tag
        self._resume_at_micros = resume_at_micros

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
        table, invalid = _refuse_bad_rows(table, self._names)
        if invalid:
            self._counters.invalid.inc(len(invalid))
            for refused in invalid:
                yield pvalue.TaggedOutput(INVALID_TAG, refused)
        if self._tag == "c" and self._resume_at_micros is not None:
            keep = pc.greater_equal(table["time"], self._resume_at_micros)
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
        changes, invalid = _upsert_tables(commands, priors)
        if invalid:
            self._counters.invalid.inc(len(invalid))
            for refused in invalid:
                yield pvalue.TaggedOutput(INVALID_TAG, refused)
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
    if pa.types.is_floating(k.type):
        k = _float_key_codes(k)   # -0.0 and 0.0 are two keys
    t = changes["time"].to_numpy()
    d = changes["diff"].to_numpy()
    same = pc.equal(k.slice(1), k.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return int((same & (t[1:] == t[:-1]) & (d[:-1] < 0) & (d[1:] > 0)).sum())


class UpsertBatches(beam.PTransform):
    """The upsert over Arrow batches: bulk change files, vectorized.

    Input elements are ``pyarrow.RecordBatch`` or ``pyarrow.Table`` with the
    columns described in this module's docstring; output elements are
    ``RecordBatch`` es of changes. Commands are hash-partitioned by key into
    ``n_partitions`` groups, each upserted by the kernel of
    :func:`upsert_table`, with the row API's rules.

    Example::

        changes = batches | UpsertBatches(prior=snapshot_batches)
        rows = changes | beam.ParDo(batches_to_changes())

    Args:
        prior: a PCollection of snapshot batches (``key``, ``value``).
            Default ``None``: every key starts without a value.
        resume_at: an apache_beam ``Timestamp``, or an ``int`` of
            microseconds since the epoch (the rule of every entry point;
            floats are refused). Default ``None``: nothing is dropped.
        n_partitions: how many groups the keys are hashed into (default
            ``DEFAULT_PARTITIONS``, 16).
        key: name of the key column (default ``"key"``).
        value: name of the value column (default ``"value"``).
        offset: name of the offset column (default ``"offset"``).
        time: name of the time column (default ``"time"``).
        label: the transform's label.

    Raises:
        ValueError: ``n_partitions`` is not a positive int, or an int
            ``resume_at`` is out of range.
        TypeError: ``resume_at`` is neither a Timestamp nor an int.

    Note:
        Bounded input only (one grouping, like the ``grouped`` flavor).
        Refused batches and rows are counted ``invalid`` and, after
        :meth:`with_invalid_output`, returned in ``result.invalid``
        (otherwise only counted).
    """

    def __init__(
        self,
        *,
        prior: Optional[PCollection] = None,
        resume_at: Union[Timestamp, int, None] = None,
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
        self._resume_at_micros = resume_micros(resume_at, where="UpsertBatches")
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
            self._names, self._n, "c", self._resume_at_micros)).with_outputs(
                INVALID_TAG, main="parts")
        parts, invalid = [split.parts], [split[INVALID_TAG]]
        if self._prior is not None:
            names = {"key": self._names["key"], "value": self._names["value"]}
            psplit = self._prior | "SplitPrior" >> beam.ParDo(_SplitByPartition(
                names, self._n, "p", None)).with_outputs(INVALID_TAG, main="parts")
            parts.append(psplit.parts)
            invalid.append(psplit[INVALID_TAG])
        applied = (
            tuple(parts) | "Merge" >> beam.Flatten().with_output_types(Tuple[int, Any])
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "GroupByPartition" >> beam.GroupByKey()
            | "Apply" >> beam.ParDo(_ApplyPartition()).with_outputs(
                INVALID_TAG, main="changes"))
        if not self._with_invalid:
            return applied.changes
        invalid.append(applied[INVALID_TAG])
        return UpsertResult(applied.changes, tuple(invalid) | "Invalid" >> beam.Flatten())

    def display_data(self):
        data = {"n_partitions": DisplayDataItem(self._n, label="Partitions")}
        if self._resume_at_micros is not None:
            data["resume_at"] = DisplayDataItem(
                str(Timestamp(micros=self._resume_at_micros)), label="Resume at")
        return data


class batches_to_changes(beam.DoFn):  # noqa: N801 - reads as a function in pipelines
    """Turns change batches into timestamped :class:`Change` rows."""

    def process(self, batch: pa.RecordBatch) -> Iterable[TimestampedValue]:
        cols = batch.to_pydict()
        for key, value, diff, micros in zip(cols["key"], cols["value"], cols["diff"], cols["time"]):
            yield TimestampedValue(Change(key, value, int(diff)), Timestamp(micros=micros))
