"""``UpsertToSupertable``'s validation: commands conformed to the table's schema,
refused ones told apart from those already applied."""

from __future__ import annotations

from typing import Any, List, Union

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.utils.windowed_value import WindowedValue

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.row_reasons import find_problems, value_problem
from beam_supertable.format.schema import conform
from beam_supertable.transforms.schema_merge import widen_for
from beam_supertable.transforms.upsert_table import (
    _UNSETTLED_TAG, INVALID_TAG, VALIDATE_BATCH_ROWS, _key_of, _key_table, _open_or_create,
    _Settings)
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, check_command
from beam_upsert.prepare import encode_key


class _Reason(str):
    """Why a command is refused (told apart from a string key or row)."""


# -- validation ------------------------------------------------------------------------


class _Validate(beam.DoFn):
    """Commands -> ``(encoded key, (time µs, offset, row | None))``, conformed.

    Malformed commands go to ``invalid`` with the reason. Rows that do not
    fit the schema and rows whose key columns disagree with the command's
    key go to ``unsettled`` as ``(command, reason)``, the reason naming the
    key and the column: invalid unless they fall below the pinned frontier
    (``_Settle``). Commands below the frontier are dropped after this step
    (by the grouped or the stateful apply). Rows come out canonical (as the table would return
    them), so comparing a new value with the prior read back from the table
    is exact. Commands are conformed ``VALIDATE_BATCH_ROWS`` at a time; each
    keeps its own timestamp and window.

    Note:
        No side input: the step fuses with the one that makes the
        commands, so they reach a runner's shuffle only once (on a portable
        runner such as Flink a step with a side input starts a new stage,
        and every element would cross between the runner and the SDK
        worker once more). The schema and key are the table's (the same in
        every version).
    """

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._counters = UpsertCounters()
        table = _open_or_create(self._s)
        self._schema = table.user_schema
        self._names = table.primary_key
        vp = table.properties.get("vector")
        self._vector = vp["column"] if vp else None

    def start_bundle(self):
        self._pending: List[tuple] = []

    def process(self, element, ts=beam.DoFn.TimestampParam, win=beam.DoFn.WindowParam):
        self._pending.append((element, ts, win))
        if len(self._pending) >= VALIDATE_BATCH_ROWS:
            yield from self._flush()

    def finish_bundle(self):
        if self._pending:
            yield from self._flush()

    def _unsettled(self, element, ts, win, reason):
        return pvalue.TaggedOutput(_UNSETTLED_TAG, WindowedValue((element, reason), ts, [win]))

    def _reject(self, element, ts, win, reason):
        self._counters.invalid.inc()
        return pvalue.TaggedOutput(INVALID_TAG, WindowedValue(Invalid(element, reason), ts, [win]))

    def _flush(self):
        pending, self._pending = self._pending, []
        if self._s.schema_mode == "merge":
            # Columns the table lacks are added first (schema_mode="merge").
            values = [c.value for c in (check_command(e)[0] for e, _, _ in pending)
                      if c is not None and isinstance(c.value, dict)]
            widened = widen_for(lambda: _open_or_create(self._s), values,
                                frozenset(self._schema.names))
            if widened is not None:
                self._schema = widened.user_schema
        ok = []   # (element, ts, win, command)
        for element, ts, win in pending:
            command, reason = check_command(element)
            if command is None:
                yield self._reject(element, ts, win, reason)
                continue
            value, key = command.value, command.key
            if value is not None and not isinstance(value, dict):
                yield self._unsettled(element, ts, win, (
                    f"key {key!r}: the row must be a dict of the table's columns "
                    f"{self._schema.names} or None (a delete), got {type(value).__name__}"))
                continue
            if value is not None:
                extra = [c for c in value if c not in self._schema.names]
                if extra:
                    yield self._unsettled(element, ts, win, (
                        f"key {key!r}: column(s) {extra} are not in the table schema "
                        f"{self._schema.names}"))
                    continue
            if len(self._names) > 1 and not (isinstance(key, tuple)
                                             and len(key) == len(self._names)):
                yield self._unsettled(element, ts, win, (
                    f"key {key!r} must be a tuple of {len(self._names)} values, one "
                    f"per key column {self._names}"))
                continue
            ok.append((element, ts, win, command))
        if not ok:
            return
        rows = [c.value for _, _, _, c in ok if c.value is not None]
        canonical = self._conform(rows)
        keys = self._canonical_keys([c.key for _, _, _, c in ok])
        i = 0
        for (element, ts, win, command), key in zip(ok, keys):
            row = None
            if command.value is not None:
                row, i = canonical[i], i + 1
            if isinstance(key, _Reason):
                yield self._unsettled(element, ts, win, key)
                continue
            if isinstance(row, _Reason):
                yield self._unsettled(element, ts, win, f"key {command.key!r}: {row}")
                continue
            if row is not None:
                held = _key_of(row, self._names)
                if held != key:
                    yield self._unsettled(element, ts, win, (
                        f"key {command.key!r}: the row's key column(s) {self._names} hold "
                        f"{held!r}, not the command's key"))
                    continue
            yield WindowedValue((encode_key(key), (ts.micros, command.offset, row)), ts, [win])

    def _conform(self, rows: List[dict]) -> List[Union[dict, str]]:
        """Each row canonical, or a reason (``column 'c' expects ..., got ...``)."""
        if not rows:
            return []
        try:
            return self._one(rows)
        except _CONFORM_ERRORS:
            pass
        # The slow path, only for a batch that does not fit: the offenders,
        # found column by column; the rest conform together.
        out: List[Union[dict, str]] = [None] * len(rows)
        problems = find_problems(rows, self._schema, self._vector)
        for n, problem in problems.items():
            out[n] = _Reason(problem)
        rest = [n for n in range(len(rows)) if n not in problems]
        try:
            for n, row in zip(rest, self._one([rows[n] for n in rest]) if rest else []):
                out[n] = row
            return out
        except _CONFORM_ERRORS:
            pass
        for n in rest:   # a cause the columns did not show: row by row
            try:
                out[n] = self._one([rows[n]])[0]
            except _CONFORM_ERRORS as exc:
                out[n] = _Reason(str(exc).replace(f"{self._s.uri}: ", "", 1))
        return out

    def _one(self, rows: List[dict]) -> List[dict]:
        table = pa.Table.from_pylist(rows, schema=self._schema) \
            if all(set(r) == set(self._schema.names) for r in rows) else rows
        return conform(self._s.uri, table, self._schema, self._vector).to_pylist()

    def _canonical_keys(self, keys: List[Any]) -> List[Any]:
        """Keys cast to the key columns' types (so 7 and 7.0 are one key), or reasons."""
        out = []
        try:
            out = [_key_of(r, self._names)
                   for r in _key_table(keys, self._schema, self._names).to_pylist()]
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            out = []
        for key in keys if not out else ():
            try:
                out.append(_key_of(_key_table([key], self._schema, self._names).to_pylist()[0],
                                   self._names))
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                out.append(_Reason(f"key {key!r}: {self._key_problem(key) or exc}"))
        for i, key in enumerate(out):
            if key is None or (isinstance(key, tuple) and None in key):
                out[i] = _Reason(f"key {keys[i]!r}: {self._key_problem(keys[i])}")
        return out

    def _key_problem(self, key: Any) -> str:
        """Which key column the key's part does not fit, and why."""
        parts = key if len(self._names) > 1 else (key,)
        for name, part in zip(self._names, parts):
            field = self._schema.field(name).with_nullable(False)  # key columns hold no null
            problem = value_problem(field, part)
            if problem is not None:
                return f"key {problem}"
        return "the key does not fit the key columns"


_CONFORM_ERRORS = (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, KeyError,
                   OverflowError)


# -- applying commands per key ------------------------------------------------------------


class _Settle(beam.DoFn):
    """Refused rows: ``Invalid`` unless below the pinned frontier (then already applied)."""

    def setup(self):
        self._counters = UpsertCounters()

    def process(self, refused, pin=None, ts=beam.DoFn.TimestampParam):
        # Unbounded input pins no version here (see expand): a refused row is
        # invalid whatever its time.
        if pin is not None and pin["frontier"] is not None and ts.micros < pin["frontier"]:
            self._counters.dropped_before_resume.inc()
            return
        self._counters.invalid.inc()
        yield Invalid(*refused)
