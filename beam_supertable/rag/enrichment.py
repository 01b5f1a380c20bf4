"""Retrieval: Beam's ``EnrichmentSourceHandler`` over a supertable, and ``EnrichWithSupertable``."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics
from apache_beam.transforms.display import DisplayDataItem

from beam_supertable.errors import SchemaMismatchError, SupertableError
from beam_supertable.format.schema import ID as ROW_ID
from beam_supertable.rag._common import (
    _ENRICHMENT_TAKES_HANDLER_JOIN, DEFAULT_K, DEFAULT_MAX_BATCH_SIZE, DEFAULT_MIN_BATCH_SIZE,
    DEFAULT_REFRESH_EVERY_S, ENRICHMENT_KEY, ID_COLUMN, METADATA_COLUMN, MODES, NAMESPACE, Chunk,
    EnrichmentSourceHandler, InvalidQueryError, _dense_of, _text_of, cross_join)
from beam_supertable.table.supertable import Supertable

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
