"""Ingestion: Beam's ``VectorDatabaseWriteConfig`` for a supertable (chunks upserted by id)."""

from __future__ import annotations

import dataclasses
import json
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
from beam_supertable.schema import ID as ROW_ID
from beam_supertable.table import Supertable
from beam_supertable.transforms import INVALID_TAG, CommitResult, WriteResult, WriteToSupertable
from beam_supertable.vector.metric import check_metric
from beam_upsert.model import Invalid
from beam_supertable.rag._common import (
    CONTENT_COLUMN, Chunk, DEFAULT_METRIC, EMBEDDING_COLUMN, ID_COLUMN, METADATA_COLUMN,
    NAMESPACE, ON_INVALID, RESERVED_COLUMNS, _WriteConfigBase, _dense_of, _metadata_value,
    _text_of, chunk_schema)
# -- ingestion -------------------------------------------------------------------


@dataclass(frozen=True)
class SupertableVectorWriterConfig(_WriteConfigBase):
    """Writes embedded ``Chunk`` s into a supertable (``VectorDatabaseWriteConfig``).

    The table (``chunk_schema``) gets a vector index on ``embedding`` and a
    BM25 index on ``content``; it is created on first write when absent.

    Example::

        config = SupertableVectorWriterConfig(
            "out/chunks", dimension=384,
            metadata_fields=[pa.field("source", pa.string())])
        commits = chunks | config.create_write_transform()
        # or, on Beam releases that ship it:
        # chunks | VectorDatabaseWriteTransform(config)

    Args:
        uri: the table (local path, ``memory://``, ``s3://``...).
        dimension: values per embedding. Needed to create the table when it
            is absent (an existing table knows its own); without it, a bounded
            write takes the dimension from the first chunk and lands as one
            append from one worker (see ``create_write_transform``).
        metric: ``"cosine"`` (default), ``"l2"`` or ``"dot"``.
        metadata_fields: metadata keys flattened into columns of these types
            (a ``pa.Schema`` or fields), so filters can use them.
        storage_options: fsspec options for the store.
        n_cells: vector grid size (default: about sqrt(rows of the first commit)).
        n_shards: superfiles per commit (default: by input size).
        job_id: a stable id makes a rerun of the same load exactly-once.
        on_invalid: ``"dead_letter"`` (count and drop; see ``with_invalid_output``)
            or ``"fail"``.

    Note:
        Chunks are appended: writing a chunk id twice stores it twice until
        the table is keyed by ``id`` (the write is one line in
        ``_WriteChunks.expand``).
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
        worker and appended as one commit. Configure ``dimension`` for the
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
    """All rows of a bounded write -> the table (dimension of the first row) -> one append."""

    def __init__(self, config: SupertableVectorWriterConfig, job_id: str):
        self._config, self._job_id = config, job_id

    def setup(self):
        self._invalid = Metrics.counter(NAMESPACE, "invalid_chunks")

    def process(self, element):
        rows = list(element[1])
        if not rows:
            return
        c = self._config
        try:
            table = Supertable.create(
                c.uri, c.schema(len(rows[0][EMBEDDING_COLUMN])), vector_column=EMBEDDING_COLUMN,
                metric=c.metric, fts_columns=[CONTENT_COLUMN], n_cells=c.n_cells,
                storage_options=c.storage_options)
        except TableExistsError:  # a concurrent writer, or a retry of this bundle
            table = Supertable.open(c.uri, storage_options=c.storage_options)
        dim = (table.properties.get("vector") or {}).get("dim")
        if dim is None or not table.user_schema.equals(c.schema(dim)):
            raise SchemaMismatchError(f"SupertableVectorWriterConfig: the table at {c.uri!r}, "
                                      f"created meanwhile, is not a chunk table for this config")
        good = []
        for row in rows:
            if len(row[EMBEDDING_COLUMN]) == dim:
                good.append(row)
                continue
            reason = (f"chunk {row[ID_COLUMN]!r}: the embedding has {len(row[EMBEDDING_COLUMN])} "
                      f"values, the table's dimension is {dim}")
            if c.on_invalid == "fail":
                raise SchemaMismatchError(f"SupertableVectorWriterConfig: {reason}")
            self._invalid.inc()
            yield pvalue.TaggedOutput(INVALID_TAG, Invalid(row, reason))
        if good:
            before = len(table.superfiles())
            version = table.append(pa.Table.from_pylist(good, schema=table.user_schema),
                                   token=f"{self._job_id}/first-chunk",
                                   metadata={"job": self._job_id}, n_shards=c.n_shards)
            yield CommitResult(version, len(good), len(table.superfiles()) - before)


class _WriteChunks(beam.PTransform):
    """Chunks -> table rows -> ``WriteToSupertable``; see ``SupertableVectorWriterConfig``."""

    def __init__(self, config: SupertableVectorWriterConfig, label: Optional[str] = None):
        super().__init__(label)
        self._config = config
        self._job_id = config.job_id or uuid.uuid4().hex
        self._with_invalid = False
        self._dimension = self._resolve_dimension()

    def _resolve_dimension(self) -> Optional[int]:
        c = self._config
        try:
            table = Supertable.open(c.uri, storage_options=c.storage_options)
        except FileNotFoundError:
            return c.dimension
        vp = table.properties.get("vector") or {}
        dim = vp.get("dim")
        if vp.get("column") != EMBEDDING_COLUMN or not table.user_schema.equals(
                chunk_schema(dim, c.metadata_fields)):
            raise SchemaMismatchError(
                f"SupertableVectorWriterConfig: the table at {c.uri!r} is not a chunk table "
                f"for this config.\nexpected (dimension {dim}):\n"
                f"{chunk_schema(dim or 1, c.metadata_fields)}\nthe table has:\n{table.user_schema}")
        if c.dimension is not None and c.dimension != dim:
            raise SchemaMismatchError(
                f"SupertableVectorWriterConfig: dimension={c.dimension}, but the table at "
                f"{c.uri!r} holds {dim}-value embeddings")
        return dim

    def with_invalid_output(self) -> "_WriteChunks":
        """Makes the transform return ``WriteResult(commits, invalid)``; ``invalid``
        holds ``beam_upsert.Invalid(element, reason)``: the Chunk when it could
        not become a row, else the row that did not fit the table."""
        self._with_invalid = True
        return self

    def expand(self, chunks):
        c = self._config
        config = dataclasses.replace(c, dimension=self._dimension) if self._dimension else c
        rows = chunks | "ChunkToRow" >> beam.ParDo(
            _ChunkToRow(config.create_converter(), c.on_invalid)).with_outputs(
                INVALID_TAG, main="rows")
        if self._dimension is not None:
            # Keyed tables: this becomes the upsert of the rows keyed by ID_COLUMN.
            written = rows.rows | "Write" >> WriteToSupertable(
                c.uri, schema=config.schema(), vector_column=EMBEDDING_COLUMN, metric=c.metric,
                fts_columns=[CONTENT_COLUMN], n_cells=c.n_cells, n_shards=c.n_shards,
                storage_options=c.storage_options, on_invalid=c.on_invalid,
                job_id=self._job_id).with_invalid_output()
            commits, rejected = written.commits, written.invalid
        else:
            if not chunks.is_bounded:
                raise ValueError(
                    f"SupertableVectorWriterConfig: no table at {c.uri!r} and no dimension; "
                    "unbounded input needs dimension= to create it")
            written = (rows.rows
                       | "OneKey" >> beam.Map(lambda row: (None, row))
                       | "Gather" >> beam.GroupByKey()
                       | "CreateAndAppend" >> beam.ParDo(
                           _CreateFromFirstChunk(c, self._job_id)).with_outputs(
                               INVALID_TAG, main="commits"))
            commits, rejected = written.commits, written[INVALID_TAG]
        if not self._with_invalid:
            return commits
        invalid = (rows[INVALID_TAG], rejected) | "AllInvalid" >> beam.Flatten()
        return WriteResult(commits, invalid)

    def display_data(self):
        return {"uri": DisplayDataItem(self._config.uri, label="Table"),
                "dimension": DisplayDataItem(self._dimension or 0, label="Dimension (0 = first chunk)"),
                "job_id": DisplayDataItem(self._job_id, label="Job id")}
