"""Ingestion: Beam's ``VectorDatabaseWriteConfig`` for a supertable (chunks upserted by id)."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.display import DisplayDataItem

from beam_supertable.errors import SchemaMismatchError, TableExistsError
from beam_supertable.format.schema import ID as ROW_ID
from beam_supertable.rag._common import (
    CONTENT_COLUMN, DEFAULT_METRIC, EMBEDDING_COLUMN, ID_COLUMN, METADATA_COLUMN, NAMESPACE,
    ON_INVALID, RESERVED_COLUMNS, Chunk, _dense_of, _metadata_value, _text_of, _WriteConfigBase,
    chunk_schema)
from beam_supertable.rag._keyed import (
    _BoundedCommands, _FailOnInvalid, _Stamp, as_row_invalid, conflicting_ids, split_conflicts,
    stamp_for, stream_command)
from beam_supertable.table.supertable import Supertable
from beam_supertable.transforms import INVALID_TAG, CommitResult, WriteResult, WriteToSupertable
from beam_supertable.transforms.upsert_write import UpsertToSupertable
from beam_supertable.vector.metric import check_metric
from beam_upsert.model import Invalid

_LOG = logging.getLogger(__name__)
_WARNED_APPEND_ONLY: set = set()   # uris warned about, so a warning is logged once each
# -- ingestion -------------------------------------------------------------------


@dataclass(frozen=True)
class SupertableVectorWriterConfig(_WriteConfigBase):
    """Writes embedded ``Chunk`` s into a supertable (``VectorDatabaseWriteConfig``).

    The table (``chunk_schema``) is keyed by ``id`` and has a vector index on
    ``embedding`` and a BM25 index on ``content``; it is created on first
    write when absent. Chunks are upserted by id, like Beam's other vector
    writers: re-ingesting a chunk replaces its row, one chunk id is one row,
    and chunks a run does not carry stay as they are.

    Example::

        config = SupertableVectorWriterConfig(
            "out/chunks", dimension=384,
            metadata_fields=[pa.field("source", pa.string())])
        commits = chunks | config.create_write_transform()
        # or, on Beam releases that ship it:
        # chunks | VectorDatabaseWriteTransform(config)

    Which chunk wins:

    * Bounded input lands as one commit. Its chunks are stamped one time,
      the wall-clock time the run starts or the table's frontier if later,
      so a run replaces what earlier runs wrote whatever timestamps the
      chunks carry (the chunks' own timestamps are not used). Copies of one
      id in one run collapse into one when their contents are equal; when
      they differ every copy is refused to the dead letters and the table
      keeps what it held for the id.
    * Unbounded input keeps the timestamps the stream carries: a chunk
      replaces the stored one when its time is later, commits land as the
      watermark passes (``UpsertToSupertable``'s stateful flavor), a chunk
      whose time is below the table's frontier is taken as applied already
      and dropped, and two copies of an id with one timestamp resolve by
      the upsert's tie rule (``beam_upsert.model``). A stream after a
      bounded run must therefore carry times later than that run.

    An existing chunk table without a primary key (written before chunk
    tables were keyed) is appended to as before, with a warning: writing a
    chunk id again stores it again. ``migrate_chunk_table(src, dst)`` copies
    its live rows into a new keyed table, one row per id.

    Args:
        uri: the table (local path, ``memory://``, ``s3://``...).
        dimension: values per embedding. Needed to create the table when it
            is absent (an existing table knows its own); without it, a bounded
            write takes the dimension from the first chunk and lands as one
            commit from one worker (see ``create_write_transform``).
        metric: ``"cosine"`` (default), ``"l2"`` or ``"dot"``.
        metadata_fields: metadata keys flattened into columns of these types
            (a ``pa.Schema`` or fields), so filters can use them.
        storage_options: fsspec options for the store.
        n_cells: vector grid size (default: about sqrt(rows of the first commit)).
        n_shards: superfiles per bounded commit (default: by input size).
        job_id: names the commits. On the append-only path (``upsert=False``
            or an unkeyed table) a stable id makes a rerun of the same load
            exactly-once; the upsert path needs none (a rerun replaces rows
            with equal ones and changes nothing).
        on_invalid: ``"dead_letter"`` (count and drop; see ``with_invalid_output``)
            or ``"fail"``.
        upsert: ``True`` (default) creates an absent table keyed by ``id``;
            ``False`` creates it append-only and appends (every write of a
            chunk id stores another row), refusing a keyed table.
    """

    uri: str
    dimension: Optional[int] = None
    metric: str = DEFAULT_METRIC
    metadata_fields: Union[pa.Schema, Sequence[pa.Field]] = ()
    storage_options: Optional[Dict[str, Any]] = None
    n_cells: Optional[int] = None
    n_shards: Optional[int] = None
    job_id: Optional[str] = None
    on_invalid: str = "dead_letter"
    upsert: bool = True

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.uri, str) or not self.uri:
            raise ValueError(f"{name}: uri must be a non-empty string, got {self.uri!r}")
        if self.dimension is not None and (
                not isinstance(self.dimension, int) or isinstance(self.dimension, bool)
                or self.dimension < 1):
            raise ValueError(f"{name}: dimension must be a positive int, got {self.dimension!r}")
        check_metric(self.metric)
        if self.on_invalid not in ON_INVALID:
            raise ValueError(f"{name}: on_invalid must be one of {ON_INVALID}, got "
                             f"{self.on_invalid!r}")
        if not isinstance(self.upsert, bool):
            raise TypeError(f"{name}: upsert must be True or False, got {self.upsert!r}")
        fields = tuple(self.metadata_fields)
        bad = [f for f in fields if not isinstance(f, pa.Field)]
        if bad:
            raise TypeError(f"{name}: metadata_fields must be pyarrow fields, got {bad[0]!r}")
        names = [f.name for f in fields]
        clash = sorted({n for n in names if n in RESERVED_COLUMNS or n == ROW_ID
                        or names.count(n) > 1})
        if clash:
            raise ValueError(f"{name}: metadata field name(s) {clash} repeat or clash with "
                             f"the chunk columns {list(RESERVED_COLUMNS) + [ROW_ID]}")
        object.__setattr__(self, "metadata_fields", fields)

    def schema(self, dimension: Optional[int] = None) -> pa.Schema:
        """The table schema for ``dimension`` (default: the configured one)."""
        dim = dimension or self.dimension
        if dim is None:
            raise ValueError(f"{type(self).__name__}: no dimension configured")
        return chunk_schema(dim, self.metadata_fields)

    def create_converter(self) -> Callable[[Chunk], Dict[str, Any]]:
        """A function from a ``Chunk`` to its table row (a dict); raises ValueError
        or TypeError, naming the chunk, for a chunk that cannot be stored."""
        dimension, fields = self.dimension, self.metadata_fields

        def convert(chunk: Chunk) -> Dict[str, Any]:
            if not isinstance(chunk, Chunk):
                raise TypeError(f"expected a Chunk, got {type(chunk).__name__}")
            if not isinstance(chunk.id, str) or not chunk.id:
                raise TypeError(f"chunk id must be a non-empty string, got {chunk.id!r}")
            dense = _dense_of(chunk)
            if dense is None:
                raise ValueError(f"chunk {chunk.id!r} has no dense embedding")
            vector = np.asarray(dense, dtype=np.float64)
            if vector.ndim != 1 or len(vector) == 0:
                raise ValueError(f"chunk {chunk.id!r}: the embedding must be a flat list of "
                                 f"numbers, got shape {vector.shape}")
            if dimension is not None and len(vector) != dimension:
                raise ValueError(f"chunk {chunk.id!r}: the embedding has {len(vector)} values, "
                                 f"the table's dimension is {dimension}")
            if not np.isfinite(vector).all():
                raise ValueError(f"chunk {chunk.id!r}: the embedding holds NaN or infinity")
            text = _text_of(chunk)
            if text is not None and not isinstance(text, str):
                raise TypeError(f"chunk {chunk.id!r}: content text must be a string")
            rest = dict(chunk.metadata or {})
            flat = {f.name: _metadata_value(chunk.id, f, rest.pop(f.name, None)) for f in fields}
            return {ID_COLUMN: chunk.id, CONTENT_COLUMN: text,
                    EMBEDDING_COLUMN: vector.tolist(),
                    METADATA_COLUMN: json.dumps(rest, sort_keys=True, default=str), **flat}

        return convert

    def create_write_transform(self) -> "_WriteChunks":
        """The PTransform that writes a PCollection of Chunks; returns the commits.

        ``.with_invalid_output()`` on it returns ``WriteResult(commits, invalid)``
        with ``beam_upsert.Invalid(element, reason)`` for each chunk that could
        not be stored.

        When the table is absent and no ``dimension`` is configured, the first
        chunk decides the dimension: the (bounded) input is gathered on one
        worker and written as one commit. Configure ``dimension`` for the
        parallel write, and for unbounded input.
        """
        return _WriteChunks(self)


class _ChunkToRow(beam.DoFn):
    def __init__(self, convert, on_invalid):
        self._convert, self._on_invalid = convert, on_invalid

    def setup(self):
        self._invalid = Metrics.counter(NAMESPACE, "invalid_chunks")

    def process(self, chunk):
        try:
            yield self._convert(chunk)
        except (TypeError, ValueError) as exc:
            if self._on_invalid == "fail":
                raise SchemaMismatchError(f"SupertableVectorWriterConfig: {exc}") from exc
            self._invalid.inc()
            yield pvalue.TaggedOutput(INVALID_TAG, Invalid(chunk, str(exc)))


class _CreateFromFirstChunk(beam.DoFn):
    """All rows of a bounded write -> the table (dimension of the first row) -> one commit."""

    def __init__(self, config: SupertableVectorWriterConfig, job_id: str):
        self._config, self._job_id = config, job_id

    def setup(self):
        self._invalid = Metrics.counter(NAMESPACE, "invalid_chunks")

    def _refuse(self, bad: Invalid):
        if self._config.on_invalid == "fail":
            raise SchemaMismatchError(f"SupertableVectorWriterConfig: {bad.reason}")
        self._invalid.inc()
        return pvalue.TaggedOutput(INVALID_TAG, bad)

    def process(self, element):
        rows = list(element[1])
        if not rows:
            return
        c = self._config
        try:
            table = Supertable.create(
                c.uri, c.schema(len(rows[0][EMBEDDING_COLUMN])), vector_column=EMBEDDING_COLUMN,
                metric=c.metric, fts_columns=[CONTENT_COLUMN], n_cells=c.n_cells,
                primary_key=ID_COLUMN if c.upsert else None, storage_options=c.storage_options)
        except TableExistsError:  # a concurrent writer, or a retry of this bundle
            table = Supertable.open(c.uri, storage_options=c.storage_options)
        dim = (table.properties.get("vector") or {}).get("dim")
        if dim is None or not table.user_schema.equals(c.schema(dim)) or \
                table.primary_key != ([ID_COLUMN] if c.upsert else []):
            raise SchemaMismatchError(f"SupertableVectorWriterConfig: the table at {c.uri!r}, "
                                      f"created meanwhile, is not a chunk table for this config")
        good = []
        for row in rows:
            if len(row[EMBEDDING_COLUMN]) == dim:
                good.append(row)
                continue
            yield self._refuse(Invalid(row, (
                f"chunk {row[ID_COLUMN]!r}: the embedding has {len(row[EMBEDDING_COLUMN])} "
                f"values, the table's dimension is {dim}")))
        if not table.primary_key:
            if good:
                before = len(table.superfiles())
                version = table.append(pa.Table.from_pylist(good, schema=table.user_schema),
                                       token=f"{self._job_id}/first-chunk",
                                       metadata={"job": self._job_id}, n_shards=c.n_shards)
                yield CommitResult(version, len(good), len(table.superfiles()) - before)
            return
        good, conflicts = split_conflicts(good)
        for bad in conflicts:
            yield self._refuse(bad)
        if good:
            # The same frontier a commit of UpsertToSupertable records: the
            # run's one command time + 1 µs, so the next run stamps above it.
            before = len(table.superfiles())
            version = table.upsert(pa.Table.from_pylist(good, schema=table.user_schema),
                                   token=f"{self._job_id}/first-chunk",
                                   metadata={"job": self._job_id},
                                   frontier=stamp_for(table) + 1, n_shards=c.n_shards)
            yield CommitResult(version, len(good), len(table.superfiles()) - before)


class _WriteChunks(beam.PTransform):
    """Chunks -> table rows -> ``UpsertToSupertable`` (a keyed table) or
    ``WriteToSupertable`` (append-only); see ``SupertableVectorWriterConfig``."""

    def __init__(self, config: SupertableVectorWriterConfig, label: Optional[str] = None):
        super().__init__(label)
        self._config = config
        self._job_id = config.job_id or uuid.uuid4().hex
        self._with_invalid = False
        self._dimension, self._keyed = self._resolve()

    def _resolve(self):
        """``(dimension, keyed)``: the existing table's, else the config's."""
        c = self._config
        try:
            table = Supertable.open(c.uri, storage_options=c.storage_options)
        except FileNotFoundError:
            return c.dimension, c.upsert
        vp = table.properties.get("vector") or {}
        dim = vp.get("dim")
        if vp.get("column") != EMBEDDING_COLUMN or not table.user_schema.equals(
                chunk_schema(dim, c.metadata_fields)) or table.primary_key not in (
                    [], [ID_COLUMN]):
            raise SchemaMismatchError(
                f"SupertableVectorWriterConfig: the table at {c.uri!r} is not a chunk table "
                f"for this config.\nexpected (dimension {dim}, keyed by {ID_COLUMN!r} or not "
                f"keyed):\n{chunk_schema(dim or 1, c.metadata_fields)}\nthe table has "
                f"(keyed by {table.primary_key}):\n{table.user_schema}")
        if c.dimension is not None and c.dimension != dim:
            raise SchemaMismatchError(
                f"SupertableVectorWriterConfig: dimension={c.dimension}, but the table at "
                f"{c.uri!r} holds {dim}-value embeddings")
        keyed = bool(table.primary_key)
        if keyed and not c.upsert:
            raise SchemaMismatchError(
                f"SupertableVectorWriterConfig: upsert=False, but the table at {c.uri!r} is "
                f"keyed by {ID_COLUMN!r}: writes to it replace chunks by id (upsert=True)")
        if not keyed and c.upsert and c.uri not in _WARNED_APPEND_ONLY:
            _WARNED_APPEND_ONLY.add(c.uri)
            _LOG.warning(
                "SupertableVectorWriterConfig: the chunk table at %r has no primary key, so "
                "chunks are appended and writing a chunk id again stores it again; "
                "migrate_chunk_table(src, dst) copies it into a table keyed by id", c.uri)
        return dim, keyed

    def with_invalid_output(self) -> "_WriteChunks":
        """Makes the transform return ``WriteResult(commits, invalid)``; ``invalid``
        holds ``beam_upsert.Invalid(element, reason)``: the Chunk when it could
        not become a row, else the row that was not written."""
        self._with_invalid = True
        return self

    def expand(self, chunks):
        c = self._config
        config = dataclasses.replace(c, dimension=self._dimension) if self._dimension else c
        rows = chunks | "ChunkToRow" >> beam.ParDo(
            _ChunkToRow(config.create_converter(), c.on_invalid)).with_outputs(
                INVALID_TAG, main="rows")
        if self._dimension is None:
            if not chunks.is_bounded:
                raise ValueError(
                    f"SupertableVectorWriterConfig: no table at {c.uri!r} and no dimension; "
                    "unbounded input needs dimension= to create it")
            written = (rows.rows
                       | "OneKey" >> beam.Map(lambda row: (None, row))
                       | "Gather" >> beam.GroupByKey()
                       | "CreateAndWrite" >> beam.ParDo(
                           _CreateFromFirstChunk(c, self._job_id)).with_outputs(
                               INVALID_TAG, main="commits"))
            commits, rejected = written.commits, [written[INVALID_TAG]]
        elif self._keyed:
            commits, rejected = self._upsert(rows.rows, config, chunks.is_bounded)
        else:
            written = rows.rows | "Write" >> WriteToSupertable(
                c.uri, schema=config.schema(), vector_column=EMBEDDING_COLUMN, metric=c.metric,
                fts_columns=[CONTENT_COLUMN], n_cells=c.n_cells, n_shards=c.n_shards,
                storage_options=c.storage_options, on_invalid=c.on_invalid,
                job_id=self._job_id).with_invalid_output()
            commits, rejected = written.commits, [written.invalid]
        if not self._with_invalid:
            return commits
        invalid = (rows[INVALID_TAG], *rejected) | "AllInvalid" >> beam.Flatten()
        return WriteResult(commits, invalid)

    def _upsert(self, rows, config: SupertableVectorWriterConfig, bounded: bool):
        """Rows -> commands (see ``SupertableVectorWriterConfig``) -> ``UpsertToSupertable``."""
        c = config
        rejected = []
        if bounded:
            stamp = beam.pvalue.AsSingleton(
                rows.pipeline | "StampStart" >> beam.Create([None])
                | "Stamp" >> beam.ParDo(_Stamp(c.uri, c.storage_options)))
            made = rows | "Commands" >> beam.ParDo(
                _BoundedCommands(c.on_invalid), stamp, conflicting_ids(rows)).with_outputs(
                    INVALID_TAG, main="commands")
            commands = made.commands
            rejected.append(made[INVALID_TAG])
        else:
            commands = rows | "Commands" >> beam.Map(stream_command)
        written = commands | "Upsert" >> UpsertToSupertable(
            c.uri, schema=c.schema(), primary_key=ID_COLUMN, vector_column=EMBEDDING_COLUMN,
            metric=c.metric, fts_columns=[CONTENT_COLUMN], storage_options=c.storage_options,
            job_id=self._job_id, flavor="grouped" if bounded else "stateful",
            n_cells=c.n_cells, n_shards=c.n_shards).with_invalid_output()
        refused = written.invalid | "AsRows" >> beam.Map(as_row_invalid)
        if c.on_invalid == "fail":
            _ = refused | "FailOnInvalid" >> beam.ParDo(_FailOnInvalid())
        rejected.append(refused)
        return written.commits, rejected

    def display_data(self):
        return {"uri": DisplayDataItem(self._config.uri, label="Table"),
                "dimension": DisplayDataItem(self._dimension or 0,
                                             label="Dimension (0 = first chunk)"),
                "upsert": DisplayDataItem(self._keyed, label="Upsert by id"),
                "job_id": DisplayDataItem(self._job_id, label="Job id")}
