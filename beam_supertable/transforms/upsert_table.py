"""``UpsertToSupertable``'s settings and the table version a run pins: opened or
created once, shared per worker, read back by key."""

from __future__ import annotations

import uuid
from typing import Any, List, Literal, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError, TableExistsError
from beam_supertable.table.lookup import KeyLookup
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms.write_stages import _TableRef

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


# Stash entries of the stateful flavor (the block was "b" before tombstones).
_STAMP_CMD, _STAMP_BLOCK = "c", "B"


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
    n_cells: Optional[int] = None   # the vector grid of a table created here
    schema_mode: str = "strict"     # "merge": columns the table lacks are added


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
                                     fts_columns=s.fts_columns, n_cells=s.n_cells,
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
    if s.schema is not None and s.schema_mode != "merge":
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
        # Retained versions only: vacuum may have removed older ones (it keeps
        # the start version when it runs behind this job: ``vacuum_every``).
        for commit in reversed(table.history()):
            if str(commit.get("token") or "").startswith(prefix):
                start = int(commit["metadata"]["start_version"])
                return start, table.checkout(start).frontier
    return table.version, table.frontier


def _stream_token(settings: _Settings, run: str, slot: Any) -> str:
    return f"{settings.job_id or 'upsert'}/{run}/{slot}"
