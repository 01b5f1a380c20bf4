"""Chunks as upsert commands on a chunk table keyed by ``id``, and the migration
of an append-only chunk table to a keyed one.

Times and offsets (``UpsertToSupertable`` drops commands below the table's
frontier and, per key, applies commands in time order, the greatest offset
winning within one time):

* Bounded input is stamped ONE time per run, ``max(now, table frontier)``
  in µs, computed once when the pipeline runs. The commit records that
  time + 1 µs as the frontier, so the next run's stamp is above it and its
  chunks replace the stored ones, whatever timestamps the chunks carry.
* Within one bounded run every chunk id has one command (offset 0):
  copies of an id with the same contents collapse into one; copies with
  different contents are all refused (dead letters) and the table keeps
  what it held for that id, since no copy is more right than another.
* Unbounded input keeps the element timestamps the stream carries (offset
  0): a chunk replaces one of an earlier time; one at a time below the
  table's frontier is already applied and dropped; two copies of an id at
  one time resolve by the upsert's tie rule (``beam_upsert.model``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.fts.analysis import matchable
from beam_supertable.rag._common import CONTENT_COLUMN, EMBEDDING_COLUMN, ID_COLUMN, NAMESPACE
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms import INVALID_TAG
from beam_upsert.model import Invalid

_LOG = logging.getLogger(__name__)
OFFSET = 0    # every chunk command's offset: one command per id and time


def now_micros() -> int:
    return time.time_ns() // 1000


def stamp_for(table: Optional[Supertable]) -> int:
    """The time (µs) of a bounded run's commands: now, or the frontier if later."""
    frontier = table.frontier if table is not None else None
    return max(now_micros(), frontier or 0)


def row_digest(row: Dict[str, Any]) -> bytes:
    """The contents of a chunk row, as bytes equal for equal rows in any process."""
    text = json.dumps(row, sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def conflict_reason(chunk_id: str) -> str:
    return (f"chunk {chunk_id!r} appears more than once in this write with different "
            "contents; no copy is written (the table keeps what it held for this id)")


def split_conflicts(rows: Iterable[Dict[str, Any]]) -> Tuple[List[dict], List[Invalid]]:
    """``(one row per id, Invalid per copy of an id whose copies differ)``."""
    by_id: Dict[str, Dict[bytes, dict]] = {}
    copies: Dict[str, List[dict]] = {}
    for row in rows:
        by_id.setdefault(row[ID_COLUMN], {})[row_digest(row)] = row
        copies.setdefault(row[ID_COLUMN], []).append(row)
    unique, refused = [], []
    for cid, distinct in by_id.items():
        if len(distinct) == 1:
            unique.append(next(iter(distinct.values())))
        else:
            refused.extend(Invalid(row, conflict_reason(cid)) for row in copies[cid])
    return unique, refused


class _Stamp(beam.DoFn):
    """The one time of a bounded run's commands (see the module docstring)."""

    def __init__(self, uri: str, storage_options: Optional[dict]) -> None:
        self._uri, self._options = uri, storage_options

    def process(self, _):
        try:
            table = Supertable.open(self._uri, storage_options=self._options)
        except FileNotFoundError:
            table = None
        yield stamp_for(table)


class _DigestsOfId(beam.CombineFn):
    """The distinct digests of one id's rows, at most two (two mean a conflict)."""

    def create_accumulator(self):
        return set()

    def add_input(self, acc, digest):
        if len(acc) < 2:
            acc.add(digest)
        return acc

    def merge_accumulators(self, accs):
        out = set()
        for acc in accs:
            out |= acc
        return set(sorted(out)[:2])

    def extract_output(self, acc):
        return len(acc)


def conflicting_ids(rows: beam.PCollection) -> beam.pvalue.AsList:
    """The ids whose rows differ within ``rows`` (bounded), as a list side input."""
    return beam.pvalue.AsList(
        rows
        | "IdDigest" >> beam.Map(lambda row: (row[ID_COLUMN], row_digest(row)))
        | "DistinctDigests" >> beam.CombinePerKey(_DigestsOfId())
        | "Differ" >> beam.Filter(lambda kv: kv[1] > 1)
        | "Ids" >> beam.Keys())


class _BoundedCommands(beam.DoFn):
    """Rows -> ``(id, row, OFFSET)`` commands at the run's stamp; copies of a
    conflicting id -> ``Invalid``."""

    def __init__(self, on_invalid: str) -> None:
        self._on_invalid = on_invalid

    def setup(self):
        self._invalid = Metrics.counter(NAMESPACE, "invalid_chunks")
        self._seen: Any = None
        self._conflicts: frozenset = frozenset()

    def process(self, row, stamp, conflicts):
        if conflicts is not self._seen:   # the side input, made a set once per value
            self._seen, self._conflicts = conflicts, frozenset(conflicts)
        cid = row[ID_COLUMN]
        if cid in self._conflicts:
            if self._on_invalid == "fail":
                raise SchemaMismatchError(f"SupertableVectorWriterConfig: {conflict_reason(cid)}")
            self._invalid.inc()
            yield pvalue.TaggedOutput(INVALID_TAG, Invalid(row, conflict_reason(cid)))
            return
        yield TimestampedValue((cid, row, OFFSET), Timestamp(micros=stamp))


def stream_command(row: Dict[str, Any]) -> Tuple[str, Dict[str, Any], int]:
    """An unbounded input's row -> its command (the element keeps its timestamp)."""
    return row[ID_COLUMN], row, OFFSET


def as_row_invalid(bad: Any) -> Invalid:
    """An upsert's ``Invalid(command, reason)`` -> ``Invalid(row, reason)``."""
    element, reason = bad
    if isinstance(element, tuple) and len(element) == 3:
        element = element[1]
    return Invalid(element, reason)


class _FailOnInvalid(beam.DoFn):
    def process(self, bad):
        raise SchemaMismatchError(f"SupertableVectorWriterConfig: {bad[1]}")


# -- migration ----------------------------------------------------------------------


def migrate_chunk_table(src: str, dst: str, *, storage_options: Optional[dict] = None,
                        n_cells: Optional[int] = None) -> int:
    """Copies the live rows of an append-only chunk table into a new table keyed by ``id``.

    The new table has the source's columns, metric and indexes; writing to
    it with ``SupertableVectorWriterConfig`` then replaces chunks by id.
    Where the source holds an id more than once, the copy read last wins
    (the files in the order their commits added them: the latest append,
    unless ``optimize`` merged the files). The source is left as it is.
    The rows are read into memory and written as one upsert: for a table
    larger than memory, read it with ``ReadFromSupertable`` and write
    ``(row["id"], row, 0)`` commands with ``UpsertToSupertable``.

    Args:
        src: the append-only chunk table.
        dst: where the keyed table is created (nothing may be there).
        storage_options: fsspec options for both stores.
        n_cells: the new table's vector grid size (default: by its rows).

    Returns:
        The new table's version holding the rows.

    Raises:
        SchemaMismatchError: ``src`` is not a chunk table, or is keyed already.
        TableExistsError: a table is at ``dst``.
    """
    source = Supertable.open(src, storage_options=storage_options)
    vp, fp = source.properties.get("vector") or {}, source.properties.get("fts") or {}
    if (vp.get("column") != EMBEDDING_COLUMN or fp.get("columns") != [CONTENT_COLUMN]
            or ID_COLUMN not in source.user_schema.names):
        raise SchemaMismatchError(f"migrate_chunk_table: {src!r} is not a chunk table")
    if source.primary_key:
        raise SchemaMismatchError(f"migrate_chunk_table: {src!r} is keyed by "
                                  f"{source.primary_key} already")
    rows = source.to_arrow(columns=source.user_schema.names)
    last: Dict[str, int] = {cid: i for i, cid in enumerate(rows[ID_COLUMN].to_pylist())}
    if len(last) < rows.num_rows:
        _LOG.warning("migrate_chunk_table: %d rows of %r repeat an id; the copy read last "
                     "of each is kept", rows.num_rows - len(last), src)
    keep = rows.take(pa.array(sorted(last.values()), pa.int64()))
    target = Supertable.create(
        dst, source.user_schema, primary_key=ID_COLUMN, vector_column=EMBEDDING_COLUMN,
        metric=vp["metric"], fts_columns=[CONTENT_COLUMN], n_cells=n_cells,
        stop_words=matchable(fp.get("stop_words", ())), text_analysis=fp.get("analysis", "none"),
        storage_options=storage_options)
    return target.upsert(keep, metadata={"migrated_from": src})
