"""``Upsert``: upsert commands in, a retraction changelog out."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, Optional, Tuple, Union

import apache_beam as beam
from apache_beam.pvalue import PCollection
from apache_beam.transforms import window
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.utils.timestamp import Duration, Timestamp

from beam_upsert.grouped import GroupedUpsertFn
from beam_upsert.model import resume_micros, retention_micros, retention_text
from beam_upsert.prepare import INVALID_TAG, CountInvalid, PrepareCommands, PreparePrior
from beam_upsert.stateful import (
    COUNTS_TAG, DEFAULT_TOMBSTONE_RETENTION_US, ReportCounts, ShardKeys, StatefulUpsertFn)

Flavor = Literal["auto", "stateful", "grouped"]
FLAVORS = ("auto", "stateful", "grouped")


class UpsertResult(NamedTuple):
    """What ``Upsert(...).with_invalid_output()`` returns."""

    changes: PCollection
    invalid: PCollection


class Upsert(beam.PTransform):
    """Turns upsert commands into a differential changelog.

    Input elements are ``UpsertCommand(key, value, offset)`` or plain 3-tuples;
    the element timestamp is the command's time and ``value=None`` deletes.
    Output elements are ``Change(key, value, diff)`` timestamped at the time
    they apply, in the global window.

    Example::

        changes = (
            commands
            | Upsert(prior=snapshot, resume_at=Timestamp(1700000000)))

    Args:
        flavor: ``"grouped"`` (one grouping; bounded input), ``"stateful"``
            (keyed state and watermark timers; any input) or ``"auto"``, the
            default: grouped when the commands and the prior are bounded,
            stateful otherwise.
        prior: a PCollection of ``(key, value)`` pairs, the persisted state
            as of ``resume_at``; it seeds each key and emits nothing. Default
            ``None``: every key starts without a value.
        resume_at: commands earlier than this are already persisted and
            dropped (counted ``dropped_before_resume``): an apache_beam
            ``Timestamp``, or an ``int`` of **microseconds** since the epoch
            (the same rule as :func:`upsert_table` and
            :class:`UpsertBatches`; floats are refused, write
            ``Timestamp(seconds)``). Default ``None``: nothing is dropped.
        tombstone_retention: how long, in event time, the stateful flavor
            remembers a deleted key's last applied time and offset (its
            tombstone), so a late command for it follows the offset rule:
            an apache_beam ``Duration`` or a number of seconds. Default one
            hour; ``0`` keeps no tombstones (a late command for a deleted key
            is then applied fresh at its own time). A command for a key with
            neither value nor tombstone at or below the newest tombstone its
            state shard dropped is refused as too late (counted
            ``too_late``). The grouped flavor sees every command at once and
            needs none.
        label: the transform's label.

    Raises:
        ValueError: an unknown flavor, an int ``resume_at`` out of range, or
            a negative ``tombstone_retention``.
        TypeError: ``prior`` is not a PCollection, ``resume_at`` is
            neither a Timestamp nor an int, or ``tombstone_retention`` is
            neither a Duration nor a number.

    Note:
        Malformed input never fails the job: malformed elements, commands
        whose offset does not order against the key's other offsets, and
        conflicting snapshot duplicates are counted ``invalid`` and, after
        :meth:`with_invalid_output`, returned as ``Invalid(element, reason)``
        in ``result.invalid`` (otherwise they are only counted). The rules
        for offset classes, equal offsets and deleted keys are in
        :mod:`beam_upsert.model`.
    """

    def __init__(
        self,
        flavor: Flavor = "auto",
        *,
        prior: Optional[PCollection] = None,
        resume_at: Union[Timestamp, int, None] = None,
        tombstone_retention: Union[Duration, int, float] = Duration(
            micros=DEFAULT_TOMBSTONE_RETENTION_US),
        label: Optional[str] = None,
    ) -> None:
        super().__init__(label)
        if flavor not in FLAVORS:
            raise ValueError(
                f"Upsert: flavor must be one of {FLAVORS}, got {flavor!r}")
        if prior is not None and not isinstance(prior, PCollection):
            raise TypeError(
                f"Upsert: prior must be a PCollection of (key, value) pairs, got "
                f"{type(prior).__name__}")
        self._flavor = flavor
        self._prior = prior
        self._resume_at_micros = resume_micros(resume_at, where="Upsert")
        self._retention_micros = retention_micros(tombstone_retention, where="Upsert")
        self._with_invalid = False

    def with_invalid_output(self) -> "Upsert":
        """Makes the transform return ``UpsertResult(changes, invalid)``."""
        self._with_invalid = True
        return self

    def resolved_flavor(self, commands: PCollection) -> str:
        """The flavor ``expand`` uses for ``commands`` (resolves ``"auto"``)."""
        if self._flavor != "auto":
            return self._flavor
        bounded = commands.is_bounded and (
            self._prior is None or self._prior.is_bounded)
        return "grouped" if bounded else "stateful"

    def expand(self, commands: PCollection):
        flavor = self.resolved_flavor(commands)
        prepared = commands | "Prepare" >> beam.ParDo(
            PrepareCommands(self._resume_at_micros)).with_outputs(INVALID_TAG, main="commands")
        keyed = [prepared.commands]
        invalid = [prepared[INVALID_TAG]]
        if self._prior is not None:
            prior = self._prior | "PreparePrior" >> beam.ParDo(
                PreparePrior()).with_outputs(INVALID_TAG, main="prior")
            keyed.append(prior.prior)
            invalid.append(prior[INVALID_TAG])
        merged = tuple(keyed) | "Merge" >> beam.Flatten().with_output_types(Tuple[bytes, Any])
        # State and grouping are per key *and window*; an upsert is per key
        # over all time, so the input's windowing must not split it.
        if not isinstance(merged.windowing.windowfn, window.GlobalWindows):
            merged = merged | "GlobalWindow" >> beam.WindowInto(
                window.GlobalWindows()).with_output_types(Tuple[bytes, Any])
        if flavor == "grouped":
            applied = (
                merged
                | "GroupByKey" >> beam.GroupByKey()
                | "Apply" >> beam.ParDo(GroupedUpsertFn()).with_outputs(
                    INVALID_TAG, main="changes"))
        else:
            applied = (
                merged
                | "Shard" >> beam.ParDo(ShardKeys()).with_output_types(Tuple[int, Any])
                | "Apply" >> beam.ParDo(StatefulUpsertFn(self._retention_micros)).with_outputs(
                    INVALID_TAG, COUNTS_TAG, main="changes"))
            _ = applied[COUNTS_TAG] | "Count" >> beam.ParDo(ReportCounts())
        conflicts = applied[INVALID_TAG] | "CountConflicts" >> beam.ParDo(CountInvalid())
        invalid.append(conflicts)
        if not self._with_invalid:
            return applied.changes
        all_invalid = tuple(invalid) | "Invalid" >> beam.Flatten()
        return UpsertResult(applied.changes, all_invalid)

    def display_data(self):
        data = {
            "flavor": DisplayDataItem(self._flavor, label="Flavor"),
            "prior": DisplayDataItem(self._prior is not None, label="Has prior"),
            "tombstone_retention": DisplayDataItem(
                retention_text(self._retention_micros), label="Tombstone retention"),
        }
        if self._resume_at_micros is not None:
            data["resume_at"] = DisplayDataItem(
                str(Timestamp(micros=self._resume_at_micros)), label="Resume at")
        return data
