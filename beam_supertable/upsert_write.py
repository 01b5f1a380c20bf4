"""``UpsertToSupertable``: upsert commands applied to a keyed supertable, the loop closed.

The table is the upsert operator's persisted state. The pipeline pins one
version of the table when it starts (creating the table when it is absent and
``schema`` and ``primary_key`` are given): its ``frontier`` is the resume
frontier (commands below it are already applied: they are dropped and
counted ``beam_upsert/dropped_before_resume``), and its live rows are the
prior values, read back by key for just the keys the commands touch
(:class:`beam_supertable.lookup.KeyLookup`: key statistics, key sections,
then only the matched rows). Each key's commands are applied on top of its
prior with the per-key rule every ``beam_upsert`` flavor shares
(:func:`beam_upsert.model.apply_times`), so the changelog semantics are
``Upsert``'s exactly.

Bounded input, grouped flavor: each bundle's commands go to the shuffle as
one list per key shard (``GROUP_SHARDS``), so a runner's per-element shuffle
cost is paid per list; the apply step groups a shard's commands by key.
Validation takes no side input and fuses with the step that makes the
commands; the frontier drop happens after the shuffle.

Bounded input lands as ONE commit: the keys whose value changed are resolved
against the version the commit lands on (their live rows get deletion
vectors; ``Mutation``), the rows of the keys that hold a value afterwards go
in as new superfiles, and the commit records ``frontier`` = the greatest
command time applied + 1 µs. Superfiles are built in parallel workers by the
stages ``WriteToSupertable`` uses (``write.build_superfiles``: sharded by
vector cell, or at random), the commit step sees only their entries and the
changed keys. A rerun of the same batch finds every command
below the frontier and commits nothing; a crash before the commit leaves the
table as it was (the rerun does the work once); a crash after it leaves the
frontier past the batch (the rerun does nothing). A retried commit bundle of
one run finds its token and commits nothing twice.

Unbounded input: the stateful flavor applies each key's commands when the
watermark passes their time, with state and timers per state shard of keys
(``beam_upsert.stateful``'s design: a watermark timer per shard and command
time); the changed rows gather on one committer whose watermark timer fires
per ``COMMIT_SLOT_US`` of event time and commits every change up to the
slot's end, recording that end as the frontier: every change below it is in
the table. A restarted job resumes from the table's frontier. No stage of the
unbounded path takes a side input: each stateful stage pins its version in
its own (checkpointed) state, and commit tokens name the run and the slot, so
a job Flink restores from a checkpoint replays onto the same pin and finds
the commits it made after that checkpoint instead of making them twice.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from typing import Any, Dict, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms import window
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer)
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_supertable.errors import SchemaMismatchError, TableExistsError
from beam_supertable.keys import KeyBatch, check_primary_key
from beam_supertable.lookup import KeyLookup
from beam_supertable.mutation import Mutation
from beam_supertable.schema import ID, conform, vector_dim
from beam_supertable.table import Supertable
from beam_supertable.write import CommitResult, _TableRef, _ToBatches, build_superfiles
from beam_supertable.vector.metric import check_metric
from beam_upsert.emit import step_kind
from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, KeyState, UpsertCommand, apply_times, check_command
from beam_upsert.prepare import decode_key, encode_key
from beam_upsert.stateful import (DEFAULT_STATE_SHARDS, ShardKeys, decode_entry,
                                  encode_entry)

__all__ = ["UpsertToSupertable", "UpsertWriteResult"]

Flavor = Literal["auto", "grouped", "stateful"]
FLAVORS = ("auto", "grouped", "stateful")
METRICS = ("l2", "cosine", "dot")
INVALID_TAG = "invalid"
_UNSETTLED_TAG = "unsettled"    # refused rows, invalid unless below the pinned frontier
_TIMES_TAG = "times"            # grouped flavor: the greatest command time applied per shard
NAMESPACE = "beam_supertable"
PUT, DEL = "put", "del"
VALIDATE_BATCH_ROWS = 2048      # commands conformed to the schema in one Arrow call
LOOKUP_BATCH_KEYS = 16384       # keys whose prior rows are read back in one lookup (each
                                # lookup reads the row groups holding them: fewer, larger)
GROUP_SHARDS = 16               # grouped flavor: key shards; each shard's commands are
                                # applied by one worker (its memory holds 1/16 of them)
SHARD_PART_COMMANDS = 4096      # commands per shard list on the way to the shuffle
ARROW_BATCH_ROWS = 4096         # changed rows per Arrow batch on the way to the builders
GRID_SAMPLE_ROWS = 50_000       # vectors sampled to train a new table's grid
COMMIT_SLOT_US = 1_000_000      # unbounded input: at most one commit per second of event time

_LOG = logging.getLogger(__name__)
_STAMP_CMD, _STAMP_BLOCK = "c", "b"   # stash entries of the stateful flavor


class UpsertWriteResult(NamedTuple):
    """What ``UpsertToSupertable(...).with_invalid_output()`` returns.

    ``commits`` holds one :class:`CommitResult` per commit; ``invalid`` holds
    ``Invalid(element, reason)`` (a 2-tuple) per refused command.
    """

    commits: beam.PCollection
    invalid: beam.PCollection


# -- the pinned version ----------------------------------------------------------
class _Settings(NamedTuple):
    """What every stage needs to open the table (plain data, pickled into the job)."""

    uri: str
    storage_options: Optional[dict]
    schema: Optional[pa.Schema]
    primary_key: Optional[List[str]]
    vector_column: Optional[str]
    metric: str
    fts_columns: Tuple[str, ...]
    job_id: Optional[str]


def _open_or_create(s: _Settings) -> Supertable:
    """The table, created when absent and ``schema`` and ``primary_key`` are given."""
    where = f"UpsertToSupertable({s.uri!r})"
    try:
        table = Supertable.open(s.uri, storage_options=s.storage_options)
    except FileNotFoundError:
        if s.schema is None or not s.primary_key:
            raise FileNotFoundError(
                f"{where}: there is no table at {s.uri!r}; pass schema= and primary_key= to "
                "create it") from None
        try:
            return Supertable.create(s.uri, s.schema, primary_key=s.primary_key,
                                     vector_column=s.vector_column, metric=s.metric,
                                     fts_columns=s.fts_columns,
                                     storage_options=s.storage_options)
        except TableExistsError:  # a concurrent creator won: check its table below
            table = Supertable.open(s.uri, storage_options=s.storage_options)
    if not table.primary_key:
        raise SchemaMismatchError(
            f"{where}: the table has no primary key; upserts need a keyed table "
            "(Supertable.create(..., primary_key=...))")
    if s.primary_key and list(s.primary_key) != table.primary_key:
        raise SchemaMismatchError(
            f"{where}: primary_key={s.primary_key!r}, but the table's key is "
            f"{table.primary_key!r}")
    if s.schema is not None:
        given = [(f.name, f.type) for f in s.schema]
        held = [(f.name, f.type) for f in table.user_schema]
        if given != held:
            raise SchemaMismatchError(
                f"{where}: schema does not match the table's.\nreceived:\n{s.schema}\n"
                f"the table has:\n{table.user_schema}")
    vp = table.properties.get("vector")
    if s.vector_column is not None and (vp is None or vp["column"] != s.vector_column):
        raise SchemaMismatchError(
            f"{where}: the table indexes {vp['column'] if vp else 'no'} vector column, not "
            f"{s.vector_column!r}")
    return table


class _Pin(beam.DoFn):
    """Opens (or creates) the table once per run: the version every stage reads."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def process(self, _):
        table = _open_or_create(self._s)
        # The run id names this run's commits (tokens): a retried commit
        # bundle finds its own commit; a rerun pins a newer version instead.
        yield {"version": table.version, "frontier": table.frontier,
               "run": uuid.uuid4().hex}


class _Handles:
    """Table handles of one worker, by pinned version (immutable, so shared)."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings
        self._lookup: Optional[KeyLookup] = None

    def lookup(self, version: int) -> KeyLookup:
        if self._lookup is None or self._lookup.table.version != version:
            self._lookup = KeyLookup(_pinned(self._s, version))
        return self._lookup


def _ref(settings: _Settings) -> _TableRef:
    """The table as the shared write stages reach it (it exists once the run is pinned)."""
    return _TableRef(settings.uri, settings.storage_options, keyed=True)


def _pinned(settings: _Settings, version: int) -> Supertable:
    """A handle on the pinned version, shared by the stages of one worker process."""
    return _ref(settings).at(version)


def _key_of(row: dict, names: Sequence[str]) -> Any:
    return row[names[0]] if len(names) == 1 else tuple(row[n] for n in names)


def _key_table(keys: Sequence[Any], schema: pa.Schema, names: Sequence[str]) -> pa.Table:
    """Python keys (scalars, or tuples for a composite key) as the key columns."""
    if len(names) == 1:
        columns = [list(keys)]
    else:
        columns = [list(c) for c in zip(*keys)] if keys else [[] for _ in names]
    return pa.table([pa.array(c, type=schema.field(n).type) for c, n in zip(columns, names)],
                    names=list(names))


class _Reason(str):
    """Why a command is refused (told apart from a string key or row)."""


# -- validation ------------------------------------------------------------------------
class _Validate(beam.DoFn):
    """Commands -> ``(encoded key, (time µs, offset, row | None))``, conformed.

    Malformed commands go to ``invalid`` with the reason. Rows that do not
    fit the schema and rows whose key columns disagree with the command's
    key go to ``unsettled`` as ``(command, reason)``: invalid unless they
    fall below the pinned frontier (``_Settle``). Commands below the
    frontier are dropped after this step (by the grouped or the stateful
    apply). Rows come out canonical (as the table would return
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
        ok = []   # (element, ts, win, command)
        for element, ts, win in pending:
            command, reason = check_command(element)
            if command is None:
                yield self._reject(element, ts, win, reason)
                continue
            value = command.value
            if value is not None and not isinstance(value, dict):
                yield self._unsettled(element, ts, win, (
                    f"the row must be a dict of the table's columns {self._schema.names} or "
                    f"None (a delete), got {type(value).__name__}"))
                continue
            if value is not None:
                extra = [c for c in value if c not in self._schema.names]
                if extra:
                    yield self._unsettled(element, ts, win, (
                        f"column(s) {extra} are not in the table schema {self._schema.names}"))
                    continue
            if len(self._names) > 1 and not (isinstance(command.key, tuple)
                                             and len(command.key) == len(self._names)):
                yield self._unsettled(element, ts, win, (
                    f"key {command.key!r} must be a tuple of {len(self._names)} values, one "
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
                yield self._unsettled(element, ts, win, row)
                continue
            if row is not None:
                held = _key_of(row, self._names)
                if held != key:
                    yield self._unsettled(element, ts, win, (
                        f"the row's key {held!r} (column(s) {self._names}) disagrees with the "
                        f"command's key {command.key!r}"))
                    continue
            yield WindowedValue((encode_key(key), (ts.micros, command.offset, row)), ts, [win])

    def _conform(self, rows: List[dict]) -> List[Union[dict, str]]:
        """Each row canonical, or a string saying why it does not fit."""
        if not rows:
            return []
        try:
            return self._one(rows)
        except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, KeyError,
                OverflowError):
            pass
        out: List[Union[dict, str]] = []
        for row in rows:   # find the offenders one by one; keep the rest
            try:
                out.extend(self._one([row]))
            except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError,
                    KeyError, OverflowError) as exc:
                out.append(_Reason(self._diagnose(row, exc)))
        return out

    def _one(self, rows: List[dict]) -> List[dict]:
        table = pa.Table.from_pylist(rows, schema=self._schema) \
            if all(set(r) == set(self._schema.names) for r in rows) else rows
        return conform(self._s.uri, table, self._schema, self._vector).to_pylist()

    def _diagnose(self, row, exc) -> str:
        for field in self._schema:
            try:
                pa.array([row.get(field.name)], type=field.type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
                return f"column {field.name!r}: {err}"
            if row.get(field.name) is None and not field.nullable:
                return f"column {field.name!r} is not nullable but the row has no value for it"
        return str(exc).replace(f"{self._s.uri}: ", "", 1)

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
                out.append(_Reason(
                    f"key {key!r} does not fit the key column(s) {self._names}: {exc}"))
        for i, key in enumerate(out):
            if key is None or (isinstance(key, tuple) and None in key):
                out[i] = _Reason(f"key {keys[i]!r} has a null part; key columns are not "
                                 "nullable")
        return out


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


class _ByShard(beam.DoFn):
    """Grouped flavor: a bundle's commands -> ``(shard, [(key, time µs, offset, row)])``.

    Keys go to ``GROUP_SHARDS`` shards by a hash of their encoded bytes, so
    the shuffle moves one list per shard and bundle instead of one element
    per command (a runner's shuffle costs per element: on Flink every
    element crosses between the runner and the SDK worker and is sorted);
    ``_ApplyGrouped`` groups each shard's commands by key.
    """

    def start_bundle(self):
        self._parts: Dict[int, list] = {}

    def process(self, element):
        key, (micros, offset, row) = element
        shard = zlib.crc32(key) % GROUP_SHARDS
        part = self._parts.setdefault(shard, [])
        part.append((key, micros, offset, row))
        if len(part) >= SHARD_PART_COMMANDS:
            yield shard, self._parts.pop(shard)

    def finish_bundle(self):
        parts, self._parts = self._parts, {}
        for shard, part in parts.items():
            yield window.GlobalWindows.windowed_value((shard, part))


class _ApplyGrouped(beam.DoFn):
    """Grouped flavor: ``(shard, parts)`` -> ``(PUT, key, row)`` / ``(DEL, key, None)``.

    Commands below the pinned frontier are dropped and counted; the
    greatest time of the others goes to ``times``. Keys are gathered
    ``LOOKUP_BATCH_KEYS`` at a time so their prior rows are read back from
    the pinned version in one lookup.
    """

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._counters = UpsertCounters()
        self._handles = _Handles(self._s)

    def start_bundle(self):
        self._pending: List[tuple] = []
        self._version = None

    def process(self, element, pin=None):
        self._version = pin["version"]
        frontier = pin["frontier"]
        by_key: Dict[bytes, list] = {}
        greatest, dropped = None, 0
        for part in element[1]:
            for key, micros, offset, row in part:
                if frontier is not None and micros < frontier:
                    dropped += 1
                    continue
                by_key.setdefault(key, []).append((micros, offset, row))
                greatest = micros if greatest is None or micros > greatest else greatest
        if dropped:
            self._counters.dropped_before_resume.inc(dropped)
        if greatest is not None:
            yield pvalue.TaggedOutput(_TIMES_TAG, greatest)
        for key, commands in by_key.items():
            self._pending.append((decode_key(key), commands))
            if len(self._pending) >= LOOKUP_BATCH_KEYS:
                yield from self._flush()

    def finish_bundle(self):
        if self._pending:
            yield from self._flush()

    def _flush(self):
        pending, self._pending = self._pending, []
        lookup = self._handles.lookup(self._version)
        table = lookup.table
        names = table.primary_key
        keys = [k for k, _ in pending]
        found = lookup.rows(_key_table(keys, table.user_schema, names),
                            table.user_schema.names).to_pylist()
        priors = {_key_of(r, names): r for r in found}
        tally = [0, 0, 0]
        for key, commands in pending:
            applied = apply_times(KeyState(priors.get(key)), commands, key=key)
            for _, offset, value, reason in applied.invalid:
                self._counters.invalid.inc()
                yield pvalue.TaggedOutput(INVALID_TAG, window.GlobalWindows.windowed_value(
                    Invalid(UpsertCommand(key, value, offset), reason)))
            if not applied.steps:
                continue
            for _, old, new in applied.steps:
                tally[step_kind(old, new)] += 1
            value = applied.state.value
            yield window.GlobalWindows.windowed_value(
                (PUT, key, value) if value is not None else (DEL, key, None))
        self._counters.add_steps(tally)


def _stream_pin(settings: _Settings, run: str) -> Tuple[int, Optional[int]]:
    """``(version, frontier)`` this run of an unbounded job started on.

    The latest version, unless this run has committed already (a restore
    from a checkpoint taken before the asking stage pinned): then the
    version its commits started from, recorded in their metadata, so every
    stage of one run reads the same priors and drops below the same
    frontier, however often Flink restores it.
    """
    table = _open_or_create(settings)
    prefix = _stream_token(settings, run, "")
    if any(t.startswith(prefix) for t in table.snapshot.recent_tokens):
        for version in range(table.version, -1, -1):
            commit = table.checkout(version).snapshot.commit
            if str(commit.get("token") or "").startswith(prefix):
                start = int(commit["metadata"]["start_version"])
                return start, table.checkout(start).frontier
    return table.version, table.frontier


def _stream_token(settings: _Settings, run: str, slot: Any) -> str:
    return f"{settings.job_id or 'upsert'}/{run}/{slot}"


class _ApplyStateful(beam.DoFn):
    """Stateful flavor: applies each key's commands when the watermark passes their time.

    Input: ``(shard, (encoded key, (time µs, offset, row | None)))`` from
    :class:`beam_upsert.stateful.ShardKeys`. State and timers live per
    state shard, not per key (``beam_upsert.stateful``'s design: a runner's
    fixed cost is per stateful key, so this pays it per shard): process calls
    append to the shard's stash and set one timer per (shard, time); a
    firing at ``t`` reads the stash once, applies every key's commands at or
    before ``t``, and rewrites the stash as one block
    ``(BLOCK, values {key: KeyState}, pending {time: [[(offset, row, key)]]})``.

    A shard pins the table version it reads priors from, and the frontier
    below which commands are dropped, on its first command
    (:func:`_stream_pin`). A key's prior is read back from the pinned
    version on its first firing (all of a firing's new keys in one lookup);
    after that the shard holds the key's state, even without a value, so a
    touched key never reads the table again (which our own commits may not
    have reached yet).
    """

    STASH = BagStateSpec("stash", coders.BytesCoder())
    PIN = ReadModifyWriteStateSpec("pin", coders.FastPrimitivesCoder())
    APPLY = TimerSpec("apply", TimeDomain.WATERMARK)

    def __init__(self, settings: _Settings, run: str) -> None:
        self._s = settings
        self._run = run

    def setup(self):
        self._counters = UpsertCounters()
        self._handles = _Handles(self._s)

    def start_bundle(self):
        # Per bundle: (shard, time) timers already set (setting one again
        # changes nothing, and each set is a message to the runner) and the
        # pins read (a pin never changes once written).
        self._set = set()
        self._pins: Dict[int, tuple] = {}

    def _pin(self, shard, pinned) -> tuple:
        pin = self._pins.get(shard)
        if pin is None:
            pin = pinned.read()
            if pin is None:
                pin = tuple(_stream_pin(self._s, self._run))
                pinned.write(pin)
            self._pins[shard] = pin
        return pin

    def process(self, element, stash=beam.DoFn.StateParam(STASH),
                pinned=beam.DoFn.StateParam(PIN), apply=beam.DoFn.TimerParam(APPLY)):
        shard, (key, (micros, offset, row)) = element
        frontier = self._pin(shard, pinned)[1]
        if frontier is not None and micros < frontier:
            self._counters.dropped_before_resume.inc()
            return
        stash.add(encode_entry((_STAMP_CMD, micros, offset, row, key)))
        tag = (shard, micros)
        if tag not in self._set:
            self._set.add(tag)
            apply.set(Timestamp(micros=micros), dynamic_timer_tag=str(micros))

    @on_timer(APPLY)
    def apply_due(self, shard=beam.DoFn.KeyParam, tag=beam.DoFn.DynamicTimerTagParam,
                  stash=beam.DoFn.StateParam(STASH), pinned=beam.DoFn.StateParam(PIN)):
        # The time comes from the tag, not the firing's timestamp: Flink keeps
        # timers in milliseconds, so a command at 1.0005 s would fire at
        # 1.000 s and never be due.
        now = int(tag)
        # A timer set again after this firing in the same bundle must be set anew.
        self._set.discard((shard, now))
        values, pending, due, fresh = {}, {}, {}, {}
        for raw in stash.read():
            entry = decode_entry(raw)
            if entry[0] == _STAMP_CMD:
                _, time, offset, row, key = entry
                if time <= now:
                    due.setdefault(key, []).append((time, offset, row))
                else:
                    fresh.setdefault(time, []).append((offset, row, key))
            else:
                _, values, pending = entry
        due_times = [time for time in pending if time <= now]
        if not due and not due_times:
            return  # an earlier firing of this shard already applied these times
        for time in due_times:
            for chunk in pending.pop(time):
                for offset, row, key in decode_entry(chunk):
                    due.setdefault(key, []).append((time, offset, row))
        priors = self._priors([k for k in due if k not in values], self._pin(shard, pinned))
        tally = [0, 0, 0]
        for encoded, commands in due.items():
            key = decode_key(encoded)
            held = values.get(encoded)
            state = KeyState(*decode_entry(held)) if held is not None \
                else KeyState(priors.get(key))
            applied = apply_times(state, commands, key=key, late_ok=True)
            # A touched key keeps its state even without a value (unlike
            # beam_upsert's), so it never reads a table our commits have not reached.
            values[encoded] = encode_entry(tuple(applied.state))
            for _, offset, value, reason in applied.invalid:
                self._counters.invalid.inc()
                yield pvalue.TaggedOutput(INVALID_TAG, Invalid(UpsertCommand(key, value, offset),
                                                               reason))
            if not applied.steps:
                continue
            for _, old, new in applied.steps:
                tally[step_kind(old, new)] += 1
            value = applied.state.value
            yield window.TimestampedValue(
                (PUT, key, value) if value is not None else (DEL, key, None),
                Timestamp(micros=applied.steps[-1][0]))
        self._counters.add_steps(tally)
        for time, commands in fresh.items():
            pending.setdefault(time, []).append(encode_entry(commands))
        stash.clear()
        stash.add(encode_entry((_STAMP_BLOCK, values, pending)))

    def _priors(self, encoded: List[bytes], pin: tuple) -> Dict[Any, dict]:
        """The live rows of keys first touched here, read back from the pinned version."""
        if not encoded:
            return {}
        lookup = self._handles.lookup(pin[0])
        table = lookup.table
        names = table.primary_key
        out: Dict[Any, dict] = {}
        keys = [decode_key(k) for k in encoded]
        for i in range(0, len(keys), LOOKUP_BATCH_KEYS):
            found = lookup.rows(_key_table(keys[i:i + LOOKUP_BATCH_KEYS], table.user_schema,
                                           names), table.user_schema.names).to_pylist()
            out.update((_key_of(r, names), r) for r in found)
        return out


class _TimesAbove(beam.DoFn):
    """Bounded stateful flavor: the times of commands at or above the pinned frontier."""

    def process(self, element, pin=None):
        micros = element[1][0]
        if pin["frontier"] is None or micros >= pin["frontier"]:
            yield micros


class _LatestPerKey(beam.DoFn):
    """Bounded input through the stateful flavor: each key's last change only."""

    def process(self, element):
        key, changes = element
        yield max(changes, key=lambda c: c[0])[1]


# -- the commit's inputs (bounded) ---------------------------------------------------------
class _KeysToArrow(beam.DoFn):
    """Changed keys -> Arrow tables of the key columns (what the commit resolves)."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def process(self, keys, pin=None):
        table = _pinned(self._s, pin["version"])
        yield _key_table(keys, table.user_schema, table.primary_key)


def _commit(settings: _Settings, *, entries: List[dict], keys: Optional[pa.Table],
            frontier: int, token: str, base_version: int,
            stamp: Optional[dict], metadata: Optional[dict] = None) -> Optional[CommitResult]:
    """One upsert commit: new superfiles plus deletion vectors for the changed keys.

    Returns:
        The CommitResult, or None when nothing was committed (no change and
        the frontier already there).
    """
    table = Supertable.open(settings.uri, storage_options=settings.storage_options)
    batch = KeyBatch(keys, table.primary_key) if keys is not None and keys.num_rows else None
    entries = sorted(entries, key=lambda e: e["id"])
    metadata = {"job": settings.job_id or token.rsplit("/", 1)[0], **(metadata or {})}
    before = table.version
    mutation = Mutation(table, "upsert", keys=batch, frontier=frontier, token=token,
                        metadata=metadata, base_version=base_version)
    # The table's one write path: a grid another writer stamped first gets
    # these superfiles rebuilt on it (same _ids), inside the commit loop.
    version = table.commit_superfiles(entries, mutation, grids=[stamp] if stamp else ())
    deduplicated = table.snapshot.deduplicated
    if version == before and not deduplicated:
        return None
    return CommitResult(version, sum(e["rows"] for e in entries), len(entries), deduplicated)


class _CommitBounded(beam.DoFn):
    """Bounded input: the whole changelog as one commit (element: the greatest time)."""

    def __init__(self, settings: _Settings) -> None:
        self._s = settings

    def setup(self):
        self._commits = Metrics.counter(NAMESPACE, "commits")
        self._rows = Metrics.counter(NAMESPACE, "rows_committed")
        self._deduplicated = Metrics.counter(NAMESPACE, "deduplicated_commits")

    def process(self, greatest, pin=None, built=(), keys=()):
        keys = [k for k in keys if k.num_rows]
        result = _commit(self._s, entries=[entry for entry, _ in built],
                         keys=pa.concat_tables(keys) if keys else None,
                         frontier=int(greatest) + 1,
                         token=f"{self._s.job_id or 'upsert'}/{pin['run']}",
                         base_version=pin["version"],
                         # Every superfile is on the plan's grid.
                         stamp=next((grid for _, grid in built if grid), None))
        if result is None:
            return
        if result.deduplicated:
            self._deduplicated.inc()
        else:
            self._commits.inc()
            self._rows.inc(result.rows)
        yield result


# -- committing per firing (unbounded) ---------------------------------------------------------
class _CommitStream(beam.DoFn):
    """Unbounded input: every change up to a slot's end, once the watermark passes it.

    All changes gather on one key; a watermark timer per ``COMMIT_SLOT_US``
    of event time commits the changes up to the slot's end (the last one of
    each key) and records the slot's end as the frontier. The commit's
    token names the run (fixed when the pipeline is built, so the same
    across Flink restarts) and the slot: a slot committed after the
    checkpoint a restarted job restores from finds its token and commits
    nothing twice. Each commit records the version the run started on
    (``start_version``), where a stage pinning after a restore reads from.
    """

    BUFFER = BagStateSpec("buffer", coders.FastPrimitivesCoder())
    PIN = ReadModifyWriteStateSpec("pin", coders.FastPrimitivesCoder())
    FRONT = ReadModifyWriteStateSpec("front", coders.FastPrimitivesCoder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def __init__(self, settings: _Settings, run: str) -> None:
        self._s = settings
        self._run = run

    def setup(self):
        self._commits = Metrics.counter(NAMESPACE, "commits")
        self._rows = Metrics.counter(NAMESPACE, "rows_committed")

    def start_bundle(self):
        self._set = set()      # slots whose timer this bundle set already
        self._pinned = False   # the pin is in state (it never changes once written)

    def process(self, element, ts=beam.DoFn.TimestampParam,
                buffer=beam.DoFn.StateParam(BUFFER), pinned=beam.DoFn.StateParam(PIN),
                flush=beam.DoFn.TimerParam(FLUSH)):
        kind, key, row = element[1]
        if not self._pinned:
            if pinned.read() is None:
                pinned.write(tuple(_stream_pin(self._s, self._run)))
            self._pinned = True
        micros = ts.micros
        buffer.add((micros, kind, key, row))
        slot_end = (micros // COMMIT_SLOT_US + 1) * COMMIT_SLOT_US
        if slot_end not in self._set:
            self._set.add(slot_end)
            flush.set(Timestamp(micros=slot_end - 1), dynamic_timer_tag=str(slot_end))

    @on_timer(FLUSH)
    def commit_due(self, tag=beam.DoFn.DynamicTimerTagParam,
                   buffer=beam.DoFn.StateParam(BUFFER), pinned=beam.DoFn.StateParam(PIN),
                   front=beam.DoFn.StateParam(FRONT)):
        # The slot's end comes from the tag: Flink keeps timers in
        # milliseconds, so the firing's timestamp (the slot's end - 1 µs)
        # arrives as the slot's end - 1 ms, and the frontier recorded would
        # be 999 µs short of the DirectRunner's.
        now = int(tag) - 1
        self._set.discard(now + 1)
        due, pending = [], []
        for entry in buffer.read():
            (due if entry[0] <= now else pending).append(entry)
        if not due:
            return
        version, start_frontier = pinned.read()
        table = Supertable.open(self._s.uri, storage_options=self._s.storage_options)
        latest: Dict[Any, tuple] = {}
        for entry in sorted(due, key=lambda e: e[0]):   # stable: arrival order within a time
            latest[entry[2]] = entry
        rows = [e[3] for e in latest.values() if e[1] == PUT]
        entries, stamp = table.write_superfiles(rows) if rows else ([], {})
        keys = _key_table(list(latest), table.user_schema, table.primary_key)
        # Late commands (a slot below what this job already committed) keep
        # the job's frontier; another writer's higher frontier is not taken
        # over: the commit then fails (FrontierError) instead of landing
        # changes below a frontier that says they are in.
        own = front.read()
        if own is None:
            own = start_frontier or 0
        frontier = max(now + 1, own)
        result = _commit(self._s, entries=list(entries), keys=keys, frontier=frontier,
                         token=_stream_token(self._s, self._run, now + 1),
                         base_version=version, stamp=stamp.get("grid"),
                         metadata={"run": self._run, "start_version": version})
        front.write(frontier)
        buffer.clear()
        for entry in pending:
            buffer.add(entry)
        if result is not None:
            if not result.deduplicated:
                self._commits.inc()
                self._rows.inc(result.rows)
            yield result


# -- the transform --------------------------------------------------------------------------------
class UpsertToSupertable(beam.PTransform):
    """Applies upsert commands to a keyed supertable: the table is the upsert's state.

    Example::

        commits = commands | UpsertToSupertable(
            "s3://bucket/docs", schema=schema, primary_key="id", vector_column="emb")
        result = commands | UpsertToSupertable("s3://bucket/docs").with_invalid_output()
        # result.commits: CommitResult per commit; result.invalid: Invalid(element, reason)

    Input elements are the commands ``Upsert`` takes: ``(key, row | None,
    offset)`` (or ``UpsertCommand``), the element timestamp being the
    command's time. ``row`` is a dict of the table's columns whose key
    column(s) equal ``key`` (a tuple for a composite key); ``None`` deletes.

    Args:
        uri: the table (a keyed table; created when absent if ``schema`` and
            ``primary_key`` are given, inside the pipeline).
        schema: the user columns, to create the table; checked against an
            existing table's.
        primary_key: the key column(s), to create the table; checked against
            an existing table's.
        vector_column, metric, fts_columns: the indexes of a table created here.
        storage_options: fsspec options of the store.
        job_id: names the commits (in their tokens and metadata).
        flavor: ``"grouped"`` (bounded input), ``"stateful"`` (watermark
            timers; any input) or ``"auto"``: grouped for bounded input,
            stateful otherwise.
        state_shards: the stateful flavor's keys are hashed onto this many
            stateful keys (state and timers per shard, not per key; see
            ``beam_upsert.stateful``).

    Note:
        Bounded input lands as ONE commit recording ``frontier`` = the
        greatest command time applied + 1 µs; commands below the table's
        frontier when the pipeline starts are dropped (counted
        ``beam_upsert/dropped_before_resume``), so rerunning a batch commits
        nothing. Unbounded input commits once per ``COMMIT_SLOT_US`` of
        event time the watermark passes, recording the slot's end. Counters:
        ``beam_upsert/inserts|updates|deletes|invalid|dropped_before_resume``
        and ``beam_supertable/commits|rows_committed``. One job at a time
        per table: a commit whose frontier is below the table's (another
        job applied later commands meanwhile) fails with FrontierError and
        commits nothing.
    """

    def __init__(self, uri: str, schema: Optional[pa.Schema] = None,
                 primary_key: Union[str, Sequence[str], None] = None,
                 vector_column: Optional[str] = None, metric: str = "l2",
                 fts_columns: Sequence[str] = (), storage_options: Optional[dict] = None,
                 job_id: Optional[str] = None, flavor: Flavor = "auto",
                 label: Optional[str] = None, *,
                 state_shards: int = DEFAULT_STATE_SHARDS) -> None:
        super().__init__(label)
        where = "UpsertToSupertable"
        if not isinstance(uri, str) or not uri:
            raise ValueError(f"{where}: uri must be a non-empty str, got {uri!r}")
        if flavor not in FLAVORS:
            raise ValueError(f"{where}: flavor must be one of {FLAVORS}, got {flavor!r}")
        if metric not in METRICS:
            raise ValueError(f"{where}: metric must be one of {METRICS}, got {metric!r}")
        if not isinstance(state_shards, int) or isinstance(state_shards, bool) \
                or state_shards < 1:
            raise ValueError(f"{where}: state_shards must be a positive int, got "
                             f"{state_shards!r}")
        check_metric(metric)
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise ValueError(f"{where}: job_id must be a non-empty str, got {job_id!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise TypeError(f"{where}: schema must be a pyarrow.Schema, got "
                            f"{type(schema).__name__}")
        if isinstance(fts_columns, str):
            fts_columns = [fts_columns]
        names = None
        if primary_key is not None:
            if not isinstance(primary_key, (str, list, tuple)):
                raise SchemaMismatchError(f"{where}: primary_key must be a column name or a "
                                          f"list of them, got {primary_key!r}")
            names = [primary_key] if isinstance(primary_key, str) else list(primary_key)
            if not names:
                raise ValueError(f"{where}: primary_key must name at least one column")
        if schema is not None:
            if ID in schema.names:
                raise SchemaMismatchError(f"{where}: column {ID!r} is reserved for row ids")
            if names:
                check_primary_key(uri, schema, names)
            for column in ([vector_column] if vector_column else []) + list(fts_columns):
                if column not in schema.names:
                    raise SchemaMismatchError(
                        f"{where}: column {column!r} is not in the schema {schema.names}")
            if vector_column:
                vector_dim(schema.field(vector_column))
        self._settings = _Settings(uri, storage_options, schema, names, vector_column, metric,
                                   tuple(fts_columns), job_id)
        self._flavor = flavor
        self._state_shards = state_shards
        self._with_invalid = False

    def with_invalid_output(self) -> "UpsertToSupertable":
        """Makes the transform return ``UpsertWriteResult(commits, invalid)``."""
        self._with_invalid = True
        return self

    def resolved_flavor(self, commands: beam.PCollection) -> str:
        """The flavor ``expand`` uses (resolves ``"auto"``)."""
        if self._flavor != "auto":
            return self._flavor
        return "grouped" if commands.is_bounded else "stateful"

    def expand(self, commands):
        s = self._settings
        bounded = commands.is_bounded
        flavor = self.resolved_flavor(commands)
        if flavor == "grouped" and not bounded:
            raise ValueError("UpsertToSupertable: flavor='grouped' needs bounded input; use "
                             "'stateful' or 'auto' for unbounded input")
        # Bounded input pins one version for the whole run (a side input).
        # Unbounded input has no side input: one from a one-element source
        # does not survive Flink's restore from a checkpoint (its source has
        # finished; the restored job sees it empty), so the stateful stages
        # pin for themselves (_stream_pin) and the run is named here, once
        # for every restart of the job.
        pin = beam.pvalue.AsSingleton(
            commands.pipeline | "Start" >> beam.Create([None])
            | "Pin" >> beam.ParDo(_Pin(s))) if bounded else None
        run = uuid.uuid4().hex
        if not isinstance(commands.windowing.windowfn, window.GlobalWindows):
            # An upsert is per key over all time: windowing must not split it.
            commands = commands | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        checked = commands | "Validate" >> beam.ParDo(_Validate(s)).with_outputs(
            INVALID_TAG, _UNSETTLED_TAG, main="commands")
        invalid = [checked[INVALID_TAG],
                   checked[_UNSETTLED_TAG] | "Settle" >> beam.ParDo(_Settle(), pin)]
        # Keys are the encoded bytes (beam_upsert.prepare): say so, so keyed
        # state and grouping use a deterministic bytes coder.
        keyed = checked.commands | "Keyed" >> beam.WindowInto(
            window.GlobalWindows()).with_output_types(Tuple[bytes, Any])
        if flavor == "grouped":
            applied = (keyed
                       | "ByShard" >> beam.ParDo(_ByShard()).with_output_types(Tuple[int, Any])
                       | "GroupKeyShards" >> beam.GroupByKey()
                       | "Apply" >> beam.ParDo(_ApplyGrouped(s), pin).with_outputs(
                           INVALID_TAG, _TIMES_TAG, main="changes"))
            times = applied[_TIMES_TAG]
        else:
            applied = (keyed
                       | "Shard" >> beam.ParDo(ShardKeys(self._state_shards)).with_output_types(
                           Tuple[int, Any])
                       | "Apply" >> beam.ParDo(_ApplyStateful(s, run)).with_outputs(
                           INVALID_TAG, main="changes"))
            # Bounded input: the frontier is the greatest time applied, so
            # commands below the pinned frontier (already in) do not count.
            times = keyed | "Times" >> beam.ParDo(_TimesAbove(), pin) if bounded else None
        invalid.append(applied[INVALID_TAG])
        changes = applied.changes
        if bounded:
            if flavor == "stateful":
                changes = (changes
                           | "ByKey" >> beam.Map(
                               lambda c, ts=beam.DoFn.TimestampParam:
                               (encode_key(c[1]), (ts.micros, c)))
                           | "GroupChanges" >> beam.GroupByKey()
                           | "Latest" >> beam.ParDo(_LatestPerKey()))
            commits = self._commit_bounded(times, changes, pin)
        else:
            commits = (changes
                       | "OneKey" >> beam.Map(lambda c: (0, c)).with_output_types(
                           Tuple[int, Any])
                       | "Commit" >> beam.ParDo(_CommitStream(s, run)).with_output_types(
                           CommitResult))
        if not self._with_invalid:
            return commits
        return UpsertWriteResult(commits, tuple(invalid) | "Invalid" >> beam.Flatten())

    def _commit_bounded(self, times, changes, pin):
        s = self._settings
        ref = _ref(s)
        rows = (changes
                | "Puts" >> beam.FlatMap(lambda c: [c[2]] if c[0] == PUT else [])
                | "BatchRows" >> beam.BatchElements(min_batch_size=1,
                                                    max_batch_size=ARROW_BATCH_ROWS)
                | "RowsToArrow" >> beam.ParDo(_ToBatches(ref, on_invalid="fail")))
        # The rows are canonical already: conforming them cannot fail.
        _, built = build_superfiles(rows, ref, None, GRID_SAMPLE_ROWS, pin)
        keys = (changes
                | "Keys" >> beam.Map(lambda c: c[1])
                | "BatchKeys" >> beam.BatchElements(min_batch_size=1,
                                                    max_batch_size=ARROW_BATCH_ROWS * 4)
                | "KeysToArrow" >> beam.ParDo(_KeysToArrow(s), pin))
        greatest = times | "Greatest" >> beam.CombineGlobally(max).without_defaults()
        return greatest | "Commit" >> beam.ParDo(
            _CommitBounded(s), pin, beam.pvalue.AsList(built), beam.pvalue.AsList(keys)
        ).with_output_types(CommitResult)

    def display_data(self):
        s = self._settings
        return {
            "uri": DisplayDataItem(s.uri, label="Table"),
            "primary_key": DisplayDataItem(", ".join(s.primary_key or ()) or "(the table's)",
                                           label="Primary key"),
            "flavor": DisplayDataItem(self._flavor, label="Flavor"),
            "state_shards": DisplayDataItem(self._state_shards, label="State shards"),
            "job_id": DisplayDataItem(s.job_id or "(one per run)", label="Job id"),
            "vector_column": DisplayDataItem(s.vector_column or "", label="Vector column"),
            "metric": DisplayDataItem(s.metric, label="Metric"),
        }
