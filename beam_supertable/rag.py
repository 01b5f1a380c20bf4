"""Beam's RAG framework on a supertable: chunk ingestion and Enrichment search.

Beam's RAG toolkit (``apache_beam.ml.rag``) writes embedded ``Chunk`` s through a
``VectorDatabaseWriteConfig`` and retrieves neighbours through an
``EnrichmentSourceHandler`` given to ``apache_beam.transforms.enrichment.Enrichment``.
Every backend Beam ships needs a database server; a supertable needs none: an
object-store path is the whole database.

Example::

    config = SupertableVectorWriterConfig("s3://bucket/chunks", dimension=384)
    _ = embedded_chunks | config.create_write_transform()

    handler = SupertableSearchEnrichmentHandler("s3://bucket/chunks", k=5,
                                                mode="hybrid")
    answered = query_chunks | Enrichment(handler, join_fn=handler.join_fn)
    # each chunk's metadata["enrichment_data"] ==
    #   {"id": [...], "distance": [...], "fields": [{...}, ...]}

The chunk table (``chunk_schema``), one row per chunk:

=============  ===============================  ==================================
column         type                             holds
=============  ===============================  ==================================
``id``         string, not null                 ``chunk.id``
``content``    string                           ``chunk.content.text``; BM25 index
``embedding``  fixed_size_list<float32, dim>    the dense embedding; vector index
``metadata``   string, not null                 the rest of ``chunk.metadata`` as
                                                a JSON object (keys sorted; values
                                                JSON cannot hold become strings)
one per field  the field's type                 each of ``metadata_fields``,
                                                flattened out of the metadata so
                                                a filter can use it
=============  ===============================  ==================================

Filters are pyarrow expressions over these columns, so metadata a query must
filter on belongs in ``metadata_fields`` (``pc.field("lang") == "en"``).

Beam versions: apache-beam 2.62 (the Flink environment) has the ``Chunk``
types and ``Enrichment`` but not ``VectorDatabaseWriteConfig`` (there the
config subclasses a local base with the same ``create_write_transform()``
contract) nor handler-supplied joins: its ``Enrichment`` ignores a handler's
``join_fn`` and calls ``_asdict()`` on requests and responses. Passing
``join_fn=handler.join_fn`` explicitly gives the same output on 2.62 and on
newer releases (where ``Enrichment(handler)`` alone also works).

Beam's ``Enrichment`` module imports google-api-core (apache-beam 2.62 also
google-cloud-aiplatform), which plain apache-beam does not install; where it
does not import, ``Enrichment`` here is None (``ENRICHMENT_IMPORT_ERROR`` says
why) and ``EnrichWithSupertable(handler)`` gives the same output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import threading
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.display import DisplayDataItem

from beam_supertable.errors import SchemaMismatchError, SupertableError, TableExistsError
from beam_supertable.schema import ID as ROW_ID
from beam_supertable.table import Supertable
from beam_supertable.transforms import INVALID_TAG, CommitResult, WriteResult, WriteToSupertable
from beam_supertable.vector.metric import check_metric

try:
    from apache_beam.ml.rag.types import Chunk
except ImportError as exc:  # pragma: no cover - setup.py requires apache-beam >= 2.62
    raise ImportError(
        f"beam_supertable.rag needs apache-beam >= 2.62 (apache_beam.ml.rag.types): {exc}") from exc

try:
    from apache_beam.transforms.enrichment import Enrichment, EnrichmentSourceHandler, cross_join
    ENRICHMENT_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as exc:
    # Beam's Enrichment module imports google-api-core (apache-beam 2.62 also
    # google-cloud-aiplatform), which plain apache-beam does not install. The
    # handler still works where it is called directly (pipelines/search_supertable).
    ENRICHMENT_IMPORT_ERROR = exc
    Enrichment = None

    class EnrichmentSourceHandler(contextlib.AbstractContextManager):  # type: ignore[no-redef]
        """The interface of Beam's ``EnrichmentSourceHandler``, where Beam's cannot import."""

        def __exit__(self, exc_type, exc_val, exc_tb):
            return None

        def get_cache_key(self, request: Any) -> str:
            return f"request: {request}"

        def batch_elements_kwargs(self) -> Dict[str, int]:
            return {}

    def cross_join(left: Dict[str, Any], right: Dict[str, Any]) -> beam.Row:
        """Beam's ``cross_join``: the right row's fields join the left's (left wins)."""
        return beam.Row(**{**right, **left})


try:
    from apache_beam.ml.rag.ingestion.base import VectorDatabaseWriteConfig as _WriteConfigBase
except ImportError:  # apache-beam 2.62 has no ingestion package
    class _WriteConfigBase(ABC):  # type: ignore[no-redef]
        """Beam's ``VectorDatabaseWriteConfig`` contract, for releases without it."""

        @abstractmethod
        def create_write_transform(self) -> beam.PTransform:
            """A PTransform that writes a PCollection of Chunks."""


__all__ = [
    "CONTENT_COLUMN", "EMBEDDING_COLUMN", "ENRICHMENT_IMPORT_ERROR", "ENRICHMENT_KEY", "ID_COLUMN",
    "METADATA_COLUMN", "EnrichWithSupertable", "InvalidQueryError",
    "SupertableSearchEnrichmentHandler", "SupertableVectorWriterConfig", "chunk_schema", "join_fn",
]

NAMESPACE = "beam_supertable.rag"
ID_COLUMN = "id"
CONTENT_COLUMN = "content"
EMBEDDING_COLUMN = "embedding"
METADATA_COLUMN = "metadata"
RESERVED_COLUMNS = (ID_COLUMN, CONTENT_COLUMN, EMBEDDING_COLUMN, METADATA_COLUMN)
ENRICHMENT_KEY = "enrichment_data"   # where Beam's vector-search handlers put results
DEFAULT_METRIC = "cosine"
DEFAULT_K = 3                        # Beam's Milvus handler's default limit
DEFAULT_MIN_BATCH_SIZE = 1
DEFAULT_MAX_BATCH_SIZE = 1000
DEFAULT_REFRESH_EVERY_S = 60.0
MODES = ("vector", "text", "hybrid", "auto")
ON_INVALID = ("dead_letter", "fail")

# Enrichment newer than apache-beam 2.62 takes the handler's join_fn and hands
# it the request and response objects themselves (use_custom_types).
_ENRICHMENT_TAKES_HANDLER_JOIN = Enrichment is None or "use_custom_types" in inspect.signature(
    Enrichment.__init__).parameters


class InvalidQueryError(SupertableError, ValueError):
    """An Enrichment request lacks what its search mode needs."""


def chunk_schema(dimension: int, metadata_fields: Sequence[pa.Field] = ()) -> pa.Schema:
    """The user schema of a chunk table (see the module docstring).

    Args:
        dimension: values per embedding.
        metadata_fields: metadata keys stored as their own (filterable) columns.
    """
    return pa.schema([
        pa.field(ID_COLUMN, pa.string(), nullable=False),
        pa.field(CONTENT_COLUMN, pa.string()),
        pa.field(EMBEDDING_COLUMN, pa.list_(pa.float32(), dimension), nullable=False),
        pa.field(METADATA_COLUMN, pa.string(), nullable=False),
        *metadata_fields,
    ])


def _text_of(chunk: Chunk) -> Optional[str]:
    content = chunk.content
    if content is None:
        return None
    if content.text is not None:
        return content.text
    image = getattr(content, "image", None)   # newer Beam: an image URI is storable text
    return image if isinstance(image, str) else None


def _dense_of(chunk: Chunk) -> Optional[list]:
    return chunk.embedding.dense_embedding if chunk.embedding is not None else None


def _metadata_value(chunk_id: str, field: pa.Field, value: Any) -> Any:
    try:
        pa.array([value], type=field.type)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ValueError(f"chunk {chunk_id!r}: metadata {field.name!r} = {value!r} is not "
                         f"{field.type} ({exc})") from exc
    return value


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
        with ``(element, reason)`` for each chunk that could not be stored.

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
            yield pvalue.TaggedOutput(INVALID_TAG, (chunk, str(exc)))


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
            yield pvalue.TaggedOutput(INVALID_TAG, (row, reason))
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
        holds ``(element, reason)``: the Chunk when it could not become a row,
        else the row that did not fit the table."""
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


# -- retrieval -------------------------------------------------------------------
class _Query(NamedTuple):
    id: Any
    mode: str
    vector: Optional[np.ndarray]
    text: Optional[str]


_CHUNK_KEY = "chunk"


def _plain(chunk: Chunk, **changes: Any) -> Chunk:
    """A new ``Chunk`` (never a subclass) with the fields of ``chunk`` and ``changes``."""
    return Chunk(**{**{f.name: getattr(chunk, f.name) for f in dataclasses.fields(Chunk)},
                    **changes})


class _Results(dict):
    """One request's results: a dict that 2.62's Enrichment can call ``_asdict()`` on.

    That release joins ``request._asdict()`` with ``response._asdict()``
    whatever the handler; ``join_fn`` takes the results back out.
    """

    def _asdict(self) -> Dict[str, Any]:
        return {ENRICHMENT_KEY: dict(self)}


@dataclass
class _ChunkRequest(Chunk):
    """The request Chunk, answered so that 2.62's Enrichment can call ``_asdict()`` on it."""

    def _asdict(self) -> Dict[str, Any]:
        return {_CHUNK_KEY: _plain(self)}


def _enriched(chunk: Chunk, data: Dict[str, Any]) -> Chunk:
    # A copy: the request may be shared with other branches of the pipeline.
    return _plain(chunk, metadata={**chunk.metadata, ENRICHMENT_KEY: dict(data)})


def join_fn(left: Any, right: Any) -> Any:
    """Joins a request with its search results, as Beam's vector-search handlers do.

    A ``Chunk`` comes back as a copy with ``metadata["enrichment_data"]`` set
    to the results; a ``beam.Row`` comes back with an ``enrichment_data``
    field added (Beam's ``cross_join``). Accepts the objects themselves (newer
    Enrichment) or their ``_asdict()`` dicts (apache-beam 2.62).
    """
    if isinstance(left, dict):
        chunk = left.get(_CHUNK_KEY)
        if len(left) == 1 and isinstance(chunk, Chunk):
            return _enriched(chunk, right[ENRICHMENT_KEY])
        return cross_join(left, right)
    if isinstance(left, Chunk):
        return _enriched(left, right)
    return cross_join(left._asdict(), right._asdict())


class SupertableSearchEnrichmentHandler(EnrichmentSourceHandler):
    """Vector, text or hybrid search of a supertable, for Beam's ``Enrichment``.

    Requests are Beam RAG ``Chunk`` s (the query vector is
    ``chunk.embedding.dense_embedding``, the query text ``chunk.content.text``)
    or ``beam.Row`` s with ``embedding`` (or ``vector``), ``text`` (or
    ``content``) and optionally ``id``. The results follow Beam's Milvus
    handler: ``{"id": [...], "distance": [...], "fields": [{...}, ...]}``,
    nearest first, where ``id`` holds the rows' ``id`` column (``_id`` when
    the table has none), ``distance`` the rows' ``_distance`` (vector: smaller
    is closer; ``1 - cos`` for cosine) or ``_score`` (text BM25 and hybrid
    reciprocal-rank fusion: larger is better), and each ``fields`` dict the
    selected columns plus ``_distance`` and/or ``_score``; a chunk table's
    ``metadata`` JSON comes back as a dict. A Chunk gets the results in
    ``metadata["enrichment_data"]``, a Row in an ``enrichment_data`` field.

    Example::

        handler = SupertableSearchEnrichmentHandler(
            "s3://bucket/chunks", mode="hybrid", k=5,
            filter=pc.field("source") == "manual", columns=["content", "source"])
        answered = questions | Enrichment(handler, join_fn=handler.join_fn)

    Args:
        uri: the table.
        mode: ``"vector"`` (default, as Beam's vector-search handlers),
            ``"text"`` (BM25 on the request's text), ``"hybrid"`` (both, fused)
            or ``"auto"`` (per request: whatever it carries, both -> hybrid).
        k: results per request.
        filter: a pyarrow expression rows must pass, or a function of the
            request returning one (or None), like BigQuery's
            ``metadata_restriction_template``; requests are batched per filter.
        columns: columns to return (default: every column but the vector).
        nprobe: vector cells probed (default: the table's measured default).
        version: search this version only (default: the latest, refreshed).
        refresh_every_s: with ``version=None``, move to the latest version at
            most this often (checked before a batch); None never refreshes.
        id_column: the column whose values fill ``id`` (default ``"id"``).
        min_batch_size, max_batch_size: ``beam.BatchElements`` bounds; a batch
            of vector requests with one filter is one search call.

    Note:
        The table is opened once per worker (``__enter__``, Beam calls it from
        the DoFn's setup); a pinned ``version`` is snapshot isolation.
    """

    def __init__(self, uri: str, *, mode: str = "vector", k: int = DEFAULT_K,
                 filter: Union[pc.Expression, Callable[[Any], Optional[pc.Expression]], None] = None,  # noqa: A002
                 columns: Optional[Sequence[str]] = None, nprobe: Optional[int] = None,
                 version: Optional[int] = None,
                 refresh_every_s: Optional[float] = DEFAULT_REFRESH_EVERY_S,
                 id_column: str = ID_COLUMN, storage_options: Optional[Dict[str, Any]] = None,
                 min_batch_size: int = DEFAULT_MIN_BATCH_SIZE,
                 max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        name = type(self).__name__
        if mode not in MODES:
            raise ValueError(f"{name}: mode must be one of {MODES}, got {mode!r}")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"{name}: k must be a positive int, got {k!r}")
        if filter is not None and not (isinstance(filter, pc.Expression) or callable(filter)):
            raise TypeError(f"{name}: filter must be a pyarrow expression or a function "
                            f"returning one, got {type(filter).__name__}")
        if columns is not None and (isinstance(columns, str)
                                    or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"{name}: columns must be a list of column names, got {columns!r}")
        if nprobe is not None and (not isinstance(nprobe, int) or nprobe < 1):
            raise ValueError(f"{name}: nprobe must be a positive int, got {nprobe!r}")
        if refresh_every_s is not None and refresh_every_s < 0:
            raise ValueError(f"{name}: refresh_every_s must be >= 0 or None, got {refresh_every_s!r}")
        if not (isinstance(min_batch_size, int) and isinstance(max_batch_size, int)
                and 1 <= min_batch_size <= max_batch_size):
            raise ValueError(f"{name}: need 1 <= min_batch_size <= max_batch_size, got "
                             f"{min_batch_size!r}, {max_batch_size!r}")
        self._uri, self._options = uri, storage_options
        self._mode, self._k, self._filter, self._nprobe = mode, k, filter, nprobe
        self._columns = None if columns is None else list(columns)
        self._version, self._refresh_every_s = version, refresh_every_s
        self._id_column = id_column
        self._batching_kwargs = {"min_batch_size": min_batch_size,
                                 "max_batch_size": max_batch_size}
        self.join_fn = join_fn
        self.use_custom_types = True
        self._table: Optional[Supertable] = None
        self._lock: Optional[threading.Lock] = None

    def __str__(self) -> str:
        # RequestResponseIO names its metrics after the caller.
        return type(self).__name__

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_table"] = state["_lock"] = None
        return state

    # -- lifecycle -------------------------------------------------------------
    def __enter__(self) -> "SupertableSearchEnrichmentHandler":
        if self._table is None:
            table = Supertable.open(self._uri, version=self._version,
                                    storage_options=self._options)
            self._check(table)
            self._table, self._opened_at = table, time.monotonic()
            self._lock = threading.Lock()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self._table = None
        return None

    def _check(self, table: Supertable) -> None:
        names = table.user_schema.names
        vp, fts = table.properties.get("vector"), table.properties.get("fts")
        where = f"{type(self).__name__}: the table at {self._uri!r}"
        if self._mode in ("vector", "hybrid") and vp is None:
            raise SupertableError(f"{where} has no vector index for mode={self._mode!r}")
        if self._mode in ("text", "hybrid") and fts is None:
            raise SupertableError(f"{where} has no text index for mode={self._mode!r}")
        columns = self._columns if self._columns is not None else [
            c for c in names if vp is None or c != vp["column"]]
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise SchemaMismatchError(f"{where} has no column(s) {unknown}; it has {names}")
        self._id_field = self._id_column if self._id_column in names else ROW_ID
        self._fields = columns
        self._search_columns = list(dict.fromkeys(
            ([self._id_field] if self._id_field != ROW_ID else []) + columns))
        meta = table.user_schema.field(METADATA_COLUMN) if METADATA_COLUMN in names else None
        self._decode_metadata = meta is not None and pa.types.is_string(meta.type)

    def _maybe_refresh(self) -> None:
        if self._version is not None or self._refresh_every_s is None:
            return
        now = time.monotonic()
        if now - self._opened_at >= self._refresh_every_s:
            self._table.refresh()
            self._opened_at = now

    def batch_elements_kwargs(self) -> Dict[str, int]:
        """Returns kwargs for ``beam.BatchElements``."""
        return self._batching_kwargs

    # -- requests --------------------------------------------------------------
    def _query(self, request: Any) -> _Query:
        if isinstance(request, Chunk):
            rid, vector, text = request.id, _dense_of(request), _text_of(request)
        elif hasattr(request, "_asdict"):
            row = request._asdict()
            rid = row.get("id")
            vector = row.get("embedding", row.get("vector"))
            text = row.get("text", row.get("content"))
        else:
            raise InvalidQueryError(f"{type(self).__name__}: a request must be a Chunk or a "
                                    f"beam.Row, got {type(request).__name__}")
        if text is not None and not isinstance(text, str):
            raise InvalidQueryError(f"request {rid!r}: text must be a string, got "
                                    f"{type(text).__name__}")
        has_text = bool(text and text.strip())
        mode = self._mode
        if mode == "auto":
            if vector is None and not has_text:
                raise InvalidQueryError(f"request {rid!r}: carries neither an embedding nor text")
            mode = ("hybrid" if has_text else "vector") if vector is not None else "text"
        if mode in ("vector", "hybrid") and vector is None:
            raise InvalidQueryError(f"request {rid!r}: {mode} search needs a dense embedding")
        if mode in ("text", "hybrid") and not has_text:
            raise InvalidQueryError(f"request {rid!r}: {mode} search needs text")
        if mode == "text":
            vector = None
        else:
            vector = np.asarray(vector, dtype=np.float32)
            if vector.ndim != 1:
                raise InvalidQueryError(f"request {rid!r}: the embedding must be a flat list")
        return _Query(rid, mode, vector, text if mode != "vector" else None)

    def _filter_for(self, request: Any) -> Optional[pc.Expression]:
        if self._filter is None or isinstance(self._filter, pc.Expression):
            return self._filter
        expr = self._filter(request)
        if expr is not None and not isinstance(expr, pc.Expression):
            raise TypeError(f"{type(self).__name__}: the filter function returned "
                            f"{type(expr).__name__}, not a pyarrow expression")
        return expr

    def get_cache_key(self, request: Any) -> str:
        """The query itself (mode, vector, text, filter): equal queries share results."""
        q, expr = self._query(request), self._filter_for(request)
        return json.dumps({
            "mode": q.mode, "text": q.text, "filter": None if expr is None else str(expr),
            "vector": None if q.vector is None else [float(x) for x in q.vector]})

    def __call__(self, request: Any, *args, **kwargs):
        """Searches for one request or a batch; ``(request, results)`` per request."""
        if self._table is None:
            self.__enter__()
        requests = request if isinstance(request, list) else [request]
        queries = [(self._query(r), self._filter_for(r)) for r in requests]
        results: List[Optional[dict]] = [None] * len(requests)
        with self._lock:  # RequestResponseIO calls from pool threads; a timed-out call may linger
            self._maybe_refresh()
            batches: Dict[str, Tuple[Optional[pc.Expression], List[int]]] = {}
            for i, (q, expr) in enumerate(queries):
                if q.mode == "vector":
                    batches.setdefault("" if expr is None else str(expr), (expr, []))[1].append(i)
                else:
                    hits = self._table.search(
                        vector=q.vector, text=q.text, k=self._k, nprobe=self._nprobe,
                        filter=expr, columns=self._search_columns)
                    results[i] = self._results(hits, "_score")
            for expr, members in batches.values():
                hits = self._table.search(
                    vector=np.stack([queries[i][0].vector for i in members]), k=self._k,
                    nprobe=self._nprobe, filter=expr, columns=self._search_columns)
                which = hits["_query"].to_numpy(zero_copy_only=False)
                for j, i in enumerate(members):
                    results[i] = self._results(hits.take(pa.array(np.flatnonzero(which == j))),
                                               "_distance")
        pairs = [self._pair(r, data) for r, data in zip(requests, results)]
        return pairs if isinstance(request, list) else pairs[0]

    def _results(self, hits: pa.Table, ranked_by: str) -> Dict[str, list]:
        rows = hits.to_pylist()
        extra = [c for c in ("_distance", "_score") if c in hits.column_names]
        fields = []
        for row in rows:
            fields.append({**{c: self._decode(c, row[c]) for c in self._fields},
                           **{c: row[c] for c in extra}})
        return {"id": [row[self._id_field] for row in rows],
                "distance": [row[ranked_by] for row in rows],
                "fields": fields}

    def _decode(self, column: str, value: Any) -> Any:
        if column == METADATA_COLUMN and self._decode_metadata and isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    @staticmethod
    def _pair(request: Any, data: Dict[str, list]) -> Tuple[Any, Any]:
        if isinstance(request, Chunk):
            if not _ENRICHMENT_TAKES_HANDLER_JOIN and not hasattr(request, "_asdict"):
                request = _ChunkRequest(**{f.name: getattr(request, f.name)
                                           for f in dataclasses.fields(Chunk)})
            return request, _Results(data)
        return request, beam.Row(**{ENRICHMENT_KEY: data})

    def display_data(self):
        return {"uri": DisplayDataItem(self._uri, label="Table"),
                "mode": DisplayDataItem(self._mode, label="Search mode"),
                "k": DisplayDataItem(self._k, label="Results per request")}


class _AskHandler(beam.DoFn):
    """Calls the handler once per batch, as RequestResponseIO's call step does."""

    def __init__(self, handler: SupertableSearchEnrichmentHandler) -> None:
        self._handler = handler

    def setup(self):
        self._handler.__enter__()
        self._requests = Metrics.counter(NAMESPACE, "requests")

    def process(self, batch):
        batch = list(batch)
        self._requests.inc(len(batch))
        for request, response in self._handler(batch):
            yield self._handler.join_fn(request, response)

    def teardown(self):
        self._handler.__exit__(None, None, None)


class EnrichWithSupertable(beam.PTransform):
    """``Enrichment(handler, join_fn=handler.join_fn)`` without Beam's Enrichment module.

    Beam's ``Enrichment`` imports google-api-core (apache-beam 2.62 also
    google-cloud-aiplatform), which plain apache-beam does not install. This
    transform batches the requests as the handler asks (``BatchElements``),
    calls it once per batch on a handle opened once per worker, and joins
    with ``handler.join_fn``: the same output, without Enrichment's
    throttling, retries and cache (a table read retries in the store).

    Example::

        answered = questions | EnrichWithSupertable(
            SupertableSearchEnrichmentHandler("out/chunks", k=3))
    """

    def __init__(self, handler: SupertableSearchEnrichmentHandler,
                 label: Optional[str] = None) -> None:
        super().__init__(label)
        if not isinstance(handler, SupertableSearchEnrichmentHandler):
            raise TypeError(f"EnrichWithSupertable: expected a SupertableSearchEnrichmentHandler, "
                            f"got {type(handler).__name__}")
        self._handler = handler

    def expand(self, requests):
        return (requests
                | "Batch" >> beam.BatchElements(**self._handler.batch_elements_kwargs())
                | "Search" >> beam.ParDo(_AskHandler(self._handler)))

    def display_data(self):
        return self._handler.display_data()
