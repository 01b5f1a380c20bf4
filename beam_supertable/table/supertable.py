"""``Supertable``: create, open, append, read, search, delete, history, vacuum.

Why this module is long: it is the table's one face, as ``LanceDataset`` is
Lance's. Every method users call is declared here with the docstring the API
reference shows; the work is done by the collaborators a handle holds
(``writes.Writer``, ``search.Searcher``) and by the operations over a handle
(``mutation``, ``optimize``, ``changes``, ``dataset``), each in its module.
"""

from __future__ import annotations

import datetime
import logging
from typing import (
    TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal, Optional, Sequence, Tuple, Union)

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable._moved import old_names
from beam_supertable.errors import (
    IcebergDisabledError, NotATableError, SchemaMismatchError, TableExistsError)
from beam_supertable.format import deletes as dv
from beam_supertable.format import fields
from beam_supertable.format.cache import DEFAULT_CACHE_BYTES, ByteCache
from beam_supertable.format.consumers import (
    CONSUMER_EXPIRY, Consumer, consumer_expiry_of, expiry_seconds)
from beam_supertable.format.documents import (
    DEFAULT_TOKEN_RETENTION_S, TOKEN_RETENTION, retention_seconds, token_retention_of)
from beam_supertable.format.filters import mask, pruned
from beam_supertable.format.keys import check_primary_key
from beam_supertable.format.manifest import (
    DEFAULT_MAX_RETRIES, CommitRequest, Manifest, Snapshot, VacuumReport)
from beam_supertable.format.vacuum import grace_seconds
from beam_supertable.format.reader import IOStats, SuperfileReader
from beam_supertable.format.schema import ID, Data, vector_dim
from beam_supertable.format.store import ObjectStore
from beam_supertable.format.superfile import VectorSpec
from beam_supertable.format.writer import TARGET_SUPERFILE_BYTES, Layout
from beam_supertable.fts import analysis as fts_analysis
from beam_supertable.fts import index as fts_index
from beam_supertable.fts import search as text_search
from beam_supertable.iceberg import metadata as iceberg_meta
from beam_supertable.table import changes as change_feed
from beam_supertable.table import consumers as feed_consumers
from beam_supertable.table import evolve
from beam_supertable.table.dataset import LiveRows
from beam_supertable.table.merge_insert import MergeInsertBuilder, MergeResult
from beam_supertable.table.mutation import FRONTIER, Mutation
from beam_supertable.table import update as _update
from beam_supertable.table import search as _search
from beam_supertable.table import tags as _tags
from beam_supertable.table import writes as _writes
from beam_supertable.table.search import Searcher
from beam_supertable.table.writes import Writer
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector.metric import check_metric

if TYPE_CHECKING:
    from beam_supertable.table.optimize import OptimizePlan

__all__ = ["CREATE_MODES", "CreateMode", "Metric", "Supertable"]

CreateMode = Literal["create", "exist_ok", "overwrite"]
CREATE_MODES = ("create", "exist_ok", "overwrite")
Metric = Literal["l2", "cosine", "dot"]
Duration = Union[float, datetime.timedelta]

_LOG = logging.getLogger(__name__)


class Supertable:
    """A table of immutable Parquet superfiles with vector and text indexes.

    Example::

        schema = pa.schema([("body", pa.string()), ("emb", pa.list_(pa.float32(), 4))])
        t = Supertable.create("memory://docs", schema, vector_column="emb",
                              fts_columns=["body"])
        t.append(pa.table({"body": ["a cat", "a dog"],
                           "emb": [[1, 0, 0, 0], [0, 1, 0, 0]]}))
        t.search(vector=[1, 0, 0, 0], k=1)        # the cat, with _distance
        t.search(text="dog", k=1)                 # the dog, with _score

    Note:
        A handle reads one version (snapshot isolation); ``refresh()`` moves
        it to the latest. Writes through a handle move it to the version they
        commit.

        What a handle keeps from its reads (opened superfiles, index
        sections, decoded codes, rerank vectors, deletion vectors, bloom
        filters) shares one LRU budget of ``cache_bytes`` (keyword of
        ``create``/``open``; ``DEFAULT_CACHE_BYTES``, 1 GiB, by default).
    """

    def __init__(self, store: ObjectStore, snapshot: Snapshot, *,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._store = store
        self._manifest = snapshot.manifest
        self._snapshot = snapshot
        self._cache = ByteCache(cache_bytes)
        self._grid: Optional[tuple] = None   # (sha256, centroids) of the grid last read
        self._searcher = Searcher(self)
        self._writer = Writer(self)
        self.io = IOStats()

    def __copy__(self) -> "Supertable":
        # A copy is its own handle: its searcher and writer serve it, not the original.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._searcher, clone._writer = Searcher(clone), Writer(clone)
        return clone

    def __deepcopy__(self, memo: dict) -> "Supertable":
        # The store and the manifest are shared clients, not values: a deep copy of a
        # handle is a handle on the same version with caches of its own.
        return type(self)(self._store, self._snapshot, cache_bytes=self._cache.capacity_bytes)

    # -- opening ---------------------------------------------------------
    @classmethod
    def create(cls, uri: str, schema: pa.Schema, *, vector_column: Optional[str] = None,
               metric: Metric = "l2", fts_columns: Sequence[str] = (),
               n_cells: Optional[int] = None, storage_options: Optional[dict] = None,
               mode: CreateMode = "create", replica_factor: float = 0.0, stop_words: Sequence[str] = (),
               target_superfile_bytes: int = TARGET_SUPERFILE_BYTES,
               single_writer: bool = False,
               cache_bytes: int = DEFAULT_CACHE_BYTES,
               primary_key: Union[str, Sequence[str], None] = None,
               iceberg: bool = True, text_analysis=fts_analysis.DEFAULT,
               token_retention: Union[float, datetime.timedelta] = DEFAULT_TOKEN_RETENTION_S,
               consumer_expiry: Union[float, datetime.timedelta, None] = None
               ) -> Supertable:
        """Creates an empty table.

        Args:
            schema: the user columns (``_id`` is added and reserved).
            mode: ``"create"`` raises TableExistsError if a table is there;
                ``"exist_ok"`` opens it instead, after checking that its schema
                and settings are the ones given (SchemaMismatchError lists
                what differs); ``"overwrite"`` commits a new, empty version with
                this schema and these settings (older versions keep their rows
                until ``vacuum``).
            primary_key: a key column or a list of them (integer, bool, date,
                timestamp, string or binary). A keyed table holds at most one
                live row per key at every version; key columns become
                non-nullable; ``upsert`` replaces rows by key.
            vector_column: a ``fixed_size_list<float>`` column to index.
            metric: ``"l2"`` (squared Euclidean), ``"cosine"`` or ``"dot"``.
            fts_columns: string columns indexed together for BM25.
            n_cells: grid size; by default ``vector.grid.default_n_cells`` of the
                rows of the first commit (~2.5 sqrt(rows) for large tables).
            replica_factor: share of rows also posted to their second-nearest
                cell (vector-only), for rows within that share of the boundary.
            stop_words: words the tokenizer drops (none by default), each one word
                to the tokenizer, lowered as it lowers the words of a text.
            text_analysis: how text becomes terms, at write and query time: English
                (Snowball stemming, Lucene's 33 stop words) by default; ``None``: the
                plain tokenizer; ``{"stemming": bool, "stop_words": "lucene" |
                "snowball" | False}`` sets each.
            cache_bytes: the handle's read cache budget (see the class note).
            iceberg: keep Apache Iceberg v2 metadata beside every version, so
                Iceberg readers read the table (see ``iceberg_metadata_location``).
            token_retention: how long a commit's token is remembered (seconds or
                a ``timedelta``; 7 days): see ``set_token_retention``.
            consumer_expiry: how long a silent change-feed consumer holds
                versions from vacuum (seconds or a ``timedelta``; 7 days unless
                set): see ``set_consumer_expiry``.
        """
        if mode not in CREATE_MODES:
            raise ValueError(f"{uri}: mode must be one of {CREATE_MODES}, got {mode!r}")
        stop_words = fts_analysis.stop_word_list(stop_words)
        agree = (text_analysis is not fts_analysis.DEFAULT, stop_words)   # (for exist_ok)
        full, props = cls.describe_create(
            uri, schema, vector_column=vector_column, metric=metric, fts_columns=fts_columns,
            n_cells=n_cells, replica_factor=replica_factor, stop_words=stop_words,
            target_superfile_bytes=target_superfile_bytes, primary_key=primary_key,
            iceberg=iceberg, text_analysis=text_analysis)
        props[TOKEN_RETENTION] = retention_seconds(token_retention)
        if consumer_expiry is not None:
            props[CONSUMER_EXPIRY] = expiry_seconds(consumer_expiry)
        store = ObjectStore(uri, storage_options, single_writer=single_writer)
        manifest = Manifest(store)
        if mode == "exist_ok":
            # Read first: opening a table that is there writes nothing.
            try:
                table = cls(store, manifest.load(), cache_bytes=cache_bytes)
            except NotATableError:
                pass
            else:
                table._check_settings(full, props, *agree)
                return table
        if fts_columns:
            fts_analysis.check_stop_words(stop_words)   # (a table there may hold one)
        try:
            return cls(store, manifest.create(full, props), cache_bytes=cache_bytes)
        except TableExistsError:
            if mode == "create":
                raise
        if mode == "overwrite":
            snapshot = manifest.commit(CommitRequest(
                operation="overwrite", schema=full, allow_schema_change=True,
                set_properties=props, reset=True))
            return cls(store, snapshot, cache_bytes=cache_bytes)
        table = cls(store, manifest.load(), cache_bytes=cache_bytes)
        table._check_settings(full, props, *agree)
        return table

    @staticmethod
    def describe_create(uri: str, schema: pa.Schema, *, vector_column: Optional[str] = None,
                        metric: Metric = "l2", fts_columns: Sequence[str] = (),
                        n_cells: Optional[int] = None, replica_factor: float = 0.0,
                        stop_words: Sequence[str] = (),
                        target_superfile_bytes: int = TARGET_SUPERFILE_BYTES,
                        primary_key: Union[str, Sequence[str], None] = None,
                        iceberg: bool = True, text_analysis=fts_analysis.DEFAULT
                        ) -> Tuple[pa.Schema, Dict[str, Any]]:
        """Checks ``create``'s arguments without writing anything.

        Returns:
            ``(schema, properties)``: the full schema (``_id`` first) and the
            table properties ``create`` would write.

        Raises:
            SchemaMismatchError, ValueError: what ``create`` would raise.
        """
        if ID in schema.names:
            raise SchemaMismatchError(f"{uri}: column {ID!r} is reserved for row ids")
        check_metric(metric)
        key = check_primary_key(uri, schema, primary_key)
        props: Dict[str, Any] = {"target_superfile_bytes": int(target_superfile_bytes)}
        if iceberg:
            props[iceberg_meta.ENABLED_PROPERTY] = dict(iceberg_meta.ENABLED_VALUE)
        if key:
            props["primary_key"] = key
            schema = pa.schema([f.with_nullable(False) if f.name in key else f for f in schema],
                               metadata=schema.metadata)
        if vector_column is not None:
            if vector_column not in schema.names:
                raise SchemaMismatchError(
                    f"{uri}: vector_column {vector_column!r} is not in the schema {schema.names}")
            dim = vector_dim(schema.field(vector_column))
            props["vector"] = {"column": vector_column, "dim": dim, "metric": metric,
                               "n_cells": n_cells, "replica_factor": float(replica_factor)}
        if fts_columns:
            for c in fts_columns:
                if c not in schema.names:
                    raise SchemaMismatchError(f"{uri}: fts column {c!r} is not in the schema")
                t = schema.field(c).type
                if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                    raise SchemaMismatchError(f"{uri}: fts column {c!r} must be a string, got {t}")
            props["fts"] = fts_analysis.fts_property(fts_columns, stop_words, text_analysis)
        # Ids given anew (a schema read from a Parquet file may bring its own).
        full = fields.with_ids(pa.schema([pa.field(ID, pa.int64(), nullable=False)]
                                         + [fields.without_ids(f) for f in schema]))
        if iceberg and not iceberg_meta.has_iceberg_form(uri, full):
            del props[iceberg_meta.ENABLED_PROPERTY]   # said in a warning, naming the column
        return full, props

    def _check_settings(self, schema: pa.Schema, props: Dict[str, Any], given=True,
                        stop_words=()) -> None:
        """For ``create(mode="exist_ok")``: the table must be the one described."""
        props = fts_analysis.held_if_not_given(props, self._snapshot.properties, given,
                                               stop_words)
        differ = []
        if not schema.equals(self.schema):
            differ.append(f"schema: the table has\n{self.user_schema}\nreceived\n"
                          f"{pa.schema([f for f in schema if f.name != ID])}")
        held = self._snapshot.properties
        for name in ("primary_key", "vector", "fts", "target_superfile_bytes"):
            if held.get(name) != props.get(name):
                differ.append(f"{name}: the table has {held.get(name)!r}, received "
                              f"{props.get(name)!r}")
        if differ:
            raise SchemaMismatchError(
                f"{self.uri}: a table exists here with other settings (mode='exist_ok' "
                "opens it only when they agree):\n  " + "\n  ".join(differ))

    @classmethod
    def open(cls, uri: str, version: Union[int, str, None] = None,
             storage_options: Optional[dict] = None, *,
             single_writer: bool = False,
             cache_bytes: int = DEFAULT_CACHE_BYTES) -> "Supertable":
        """Opens one version (the latest by default): a consistent snapshot.

        Args:
            version: a version number, or a tag's name (see :attr:`tags`).
            cache_bytes: the handle's read cache budget (see the class note).

        Raises:
            TagNotFoundError: ``version`` names no tag (the message lists them).
        """
        store = ObjectStore(uri, storage_options, single_writer=single_writer)
        return cls(store, Manifest(store).load(_tags.resolve(store, version)),
                   cache_bytes=cache_bytes)

    def refresh(self) -> "Supertable":
        """This handle, moved to the latest version."""
        self._snapshot = self._manifest.load()
        return self

    def checkout(self, version: Union[int, str]) -> "Supertable":
        """Another handle on ``version`` (a version number or a tag's name) of the
        same table."""
        return Supertable(self._store, self._manifest.load(_tags.resolve(self._store, version)),
                          cache_bytes=self._cache.capacity_bytes)

    # -- metadata --------------------------------------------------------
    @property
    def uri(self) -> str:
        return self._store.uri

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def version(self) -> int:
        return self._snapshot.version

    @property
    def schema(self) -> pa.Schema:
        return self._snapshot.schema

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def cache(self) -> ByteCache:
        """The handle's read cache (one LRU byte budget)."""
        return self._cache

    @property
    def properties(self) -> Dict[str, Any]:
        return dict(self._snapshot.properties)

    @property
    def primary_key(self) -> List[str]:
        """The key column names; empty for a table without a key."""
        return list(self._snapshot.properties.get("primary_key", ()))

    @property
    def frontier(self) -> Optional[int]:
        """The source frontier recorded by the last commit that set one, or None.

        Microseconds since the epoch, exclusive: commands before it are
        applied. Kept in the version document, so reading it is O(1).
        """
        return self._snapshot.properties.get(FRONTIER)

    @property
    def user_schema(self) -> pa.Schema:
        return pa.schema([f for f in self.schema if f.name != ID])

    def history(self) -> List[Dict[str, Any]]:
        return self._manifest.history()

    def _vector_props(self) -> Optional[dict]:
        return self._snapshot.properties.get("vector")

    def _fts_props(self) -> Optional[dict]:
        return self._snapshot.properties.get("fts")

    def layout(self) -> Layout:
        vp, fp = self._vector_props(), self._fts_props()
        return Layout(
            vector=VectorSpec(vp["column"], vp["metric"], vp["dim"]) if vp else None,
            fts_columns=tuple(fp["columns"]) if fp else (),
            analysis=fts_analysis.analyzer_of(fp),
            replica_factor=vp.get("replica_factor", 0.0) if vp else 0.0,
            target_bytes=self._snapshot.properties.get("target_superfile_bytes",
                                                       TARGET_SUPERFILE_BYTES),
            primary_key=tuple(self.primary_key))

    # -- the grid ----------------------------------------------------------
    def grid(self) -> Optional[np.ndarray]:
        """The table's cell centroids, or None before the first vector commit."""
        ref = self._snapshot.properties.get("grid")
        if ref is None:
            return None
        if self._grid is None or self._grid[0] != ref["sha256"]:
            # Keyed by the grid's hash: optimize may split cells (a new grid).
            self._grid = (ref["sha256"], grid_mod.from_bytes(self._store.get(ref["path"])))
        return self._grid[1]

    def train_grid(self, vectors: np.ndarray, rows: Optional[int] = None) -> tuple:
        """Trains and uploads a grid (not yet stamped); returns (centroids, stamp).

        Args:
            vectors: the training rows (all of them, or a sample).
            rows: how many rows the grid is for, when ``vectors`` is a sample;
                the default cell count derives from it.
        """
        vp = self._vector_props()
        n_cells = vp.get("n_cells") or grid_mod.default_n_cells(rows or len(vectors))
        centroids = grid_mod.train(vectors, n_cells, vp["metric"])
        data = grid_mod.to_bytes(centroids)
        path = grid_mod.grid_path()
        self._store.put_if_absent(path, data)
        stamp = {"path": path, "n_cells": int(len(centroids)), "sha256": grid_mod.fingerprint(data)}
        return centroids, stamp

    # -- writing ---------------------------------------------------------
    def append(self, data: Data, *, token: Optional[str] = None,
               metadata: Optional[Dict[str, Any]] = None, frontier: Optional[int] = None,
               max_retries: int = DEFAULT_MAX_RETRIES, n_shards: Optional[int] = None,
               memory_budget_bytes: Optional[int] = None, schema_mode: str = "strict") -> int:
        """Appends rows as one commit; returns the new version.

        Validates everything before writing anything, assigns fresh ``_id`` s,
        shards the rows into superfiles (``cell % n_shards`` with a vector
        column, else by size, about 64 MiB of input each), builds and uploads
        them, and commits once. Appending nothing is a no-op (unless it moves
        the frontier).

        On a keyed table, ``append`` only adds keys: a key given twice, or
        already live in the version the commit lands on, raises
        DuplicateKeyError and commits nothing (``upsert`` replaces rows).

        Args:
            token: idempotency token. An append whose token already landed
                with the same rows (by content: see
                ``manifest.commit_fingerprint``) returns that version and
                commits nothing; with other rows it raises TokenReuseError.
            metadata: JSON data kept in the commit.
            frontier: the source frontier (µs since the epoch, exclusive)
                this commit records; it may not be lower than the table's.
            memory_budget_bytes: refuse (MemoryBudgetError) an append whose
                estimated peak memory exceeds this, before writing anything.
            schema_mode: ``"strict"`` (the default): a column the table lacks
                is refused. ``"merge"``: such columns are added first (one
                schema commit, see ``add_columns``); in both, table columns the
                rows lack are null.

        Raises:
            SchemaMismatchError: data that does not fit the schema; the message
                names the column and row (a null key included).
            DuplicateKeyError: on a keyed table, a repeated or live key.
            FrontierError: ``frontier`` is below the table's.
            TokenReuseError: ``token`` already landed with other rows.
            CommitFailedError: the commit did not land within ``max_retries``.
        """
        if evolve.check_schema_mode(schema_mode) == "merge":
            data = evolve.merge_input(self, data, max_retries=max_retries, operation="append",
                                       token=token)
        return self._writer.write(data, "append", token=token, metadata=metadata,
                                  frontier=frontier, max_retries=max_retries, n_shards=n_shards,
                                  memory_budget_bytes=memory_budget_bytes)

    def upsert(self, data: Data, *, token: Optional[str] = None,
               metadata: Optional[Dict[str, Any]] = None, frontier: Optional[int] = None,
               max_retries: int = DEFAULT_MAX_RETRIES, n_shards: Optional[int] = None,
               memory_budget_bytes: Optional[int] = None, schema_mode: str = "strict") -> int:
        """Inserts rows, or replaces the live row with the same key, in one commit.

        The keys are resolved against the version the commit lands on (a lost
        race re-resolves them on the winner's version), so at every version a
        key has at most one live row and the last committer wins. The commit
        holds the new superfiles plus deletion vectors for the rows replaced;
        older versions still read their own rows. Finding the rows reads only
        the key columns of superfiles whose key range and bloom filter may
        hold one of the keys.

        It is ``merge_insert().when_matched_update_all()
        .when_not_matched_insert_all().execute(data)`` (see ``merge_insert``
        for conditions and deleting what a source lacks).

        Args:
            token: as for ``append``.
            metadata: as for ``append``.
            frontier: as for ``append``.
            max_retries: as for ``append``.
            n_shards: as for ``append``.
            memory_budget_bytes: as for ``append``.
            schema_mode: as for ``append``.

        Returns:
            The version holding the upsert (this handle moves to it).

        Raises:
            SchemaMismatchError: the table has no primary key, or the rows do
                not fit the schema (a null key names its row).
            DuplicateKeyError: a key appears twice in ``data``; nothing is written.
            FrontierError: ``frontier`` is below the table's.
        """
        if not self.primary_key:
            raise SchemaMismatchError(
                f"{self.uri}: upsert needs a keyed table; this one has no primary key "
                f"(create it with primary_key=...), use append")
        if evolve.check_schema_mode(schema_mode) == "merge":
            data = evolve.merge_input(self, data, max_retries=max_retries, operation="upsert",
                                       token=token)
        # The builder's common case (``merge_insert.MergeInsertBuilder``), on its key path.
        return (self.merge_insert().when_matched_update_all().when_not_matched_insert_all()
                .execute(data, token=token, metadata=metadata, frontier=frontier,
                         max_retries=max_retries, n_shards=n_shards,
                         memory_budget_bytes=memory_budget_bytes).version)

    def delete(self, filter: pc.Expression, *, token: Optional[str] = None,  # noqa: A002
               metadata: Optional[Dict[str, Any]] = None, frontier: Optional[int] = None,
               max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Deletes the rows matching ``filter`` with deletion vectors, in one commit.

        The filter is resolved against the version the commit lands on (the
        latest; a lost race re-evaluates it on the superfiles added since), so
        a delete never misses a matching row visible when it committed.
        Deleting by key: ``delete(pc.field("id").isin([...]))``.

        Returns:
            The version holding the delete, or the latest version when no
            row matched (nothing is committed then, unless ``frontier``
            moves the table's frontier).

        Raises:
            FrontierError: ``frontier`` is below the table's.
        """
        mutation = Mutation(self, "delete", filter=filter,
                            frontier=self._writer.frontier_arg(frontier, token), token=token,
                            metadata=metadata, base_version=self.version)
        return self.commit_superfiles((), mutation, max_retries=max_retries)

    # -- merge_insert, update, restore (table/merge_insert.py, table/update.py) --
    def merge_insert(self, on: Union[str, Sequence[str], None] = None) -> MergeInsertBuilder:
        """A builder of a conditional upsert, LanceDB's ``merge_insert``.

        ``on`` names the columns matching source and target rows: by default
        (and only) the primary key on a keyed table; required on a table
        without one. Add clauses, then ``execute(rows)``: one commit (none
        when nothing changes), returning a ``MergeResult``::

            t.merge_insert("id") \\
             .when_matched_update_all(where=pc.field("source.ts") > pc.field("target.ts")) \\
             .when_not_matched_insert_all() \\
             .when_not_matched_by_source_delete() \\
             .execute(rows)

        ``upsert(rows)`` is ``merge_insert().when_matched_update_all()
        .when_not_matched_insert_all().execute(rows)``.

        Raises:
            SchemaMismatchError: ``on`` missing on a key-less table, naming
                an unknown column, or other than the primary key of a keyed one.
        """
        return MergeInsertBuilder(self, on)

    def update(self, where: Optional[pc.Expression], values: Dict[str, Any], *,
               metadata: Optional[Dict[str, Any]] = None,
               max_retries: int = DEFAULT_MAX_RETRIES) -> MergeResult:
        """Sets ``values`` on the live rows matching ``where`` (all rows when None), one commit.

        ``values`` maps a column to a scalar or a pyarrow expression over the
        row's columns (``{"v": pc.field("v") + 1}``), evaluated on the old
        row. Updated rows are written anew (a vector is re-assigned to its
        cell, text re-indexed); the change feed shows each as a retraction
        and an insertion. Nothing matching commits nothing.

        Returns:
            A ``MergeResult`` with ``num_updated_rows`` and ``version``.

        Raises:
            SchemaMismatchError: an unknown column, a primary-key column, a
                value that does not fit its column (each named).
        """
        return _update.update(self, where, values, metadata=metadata, max_retries=max_retries)

    def restore(self, version: Union[int, str], *, metadata: Optional[Dict[str, Any]] = None,
                max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Commits a new version whose rows (and schema) equal ``version`` 's
        (a version number or a tag's name).

        A commit, not a rewind: history, tokens and consumers stay, and the
        change feed over the restore retracts the rows only live now and
        inserts the rows only live then (rows live in both are untouched).

        Returns:
            The new version (this handle moves to it).

        Raises:
            VersionNotFoundError: ``version`` is unknown or vacuumed (named).
        """
        return _update.restore(self, _tags.resolve(self._store, version), metadata=metadata,
                               max_retries=max_retries)

    def write_superfiles(self, data: Data, *, n_shards: Optional[int] = None,
                         conformed: bool = False) -> tuple:
        """Validates and uploads superfiles without committing them.

        Returns:
            ``(entries, properties_to_stamp)``: the manifest entries, and the
            grid stamp when this write trained the table's first grid. Commit
            them with ``commit(CommitRequest(add_entries=..., set_properties=...))``;
            uncommitted superfiles are orphans that ``vacuum`` reclaims.
        """
        return self._writer.write_superfiles(data, n_shards=n_shards, conformed=conformed)

    def commit(self, request: CommitRequest, *,
               rebuild: Optional[Callable[[Snapshot], Optional[CommitRequest]]] = None,
               **kwargs) -> int:
        """Commits a prepared request; this handle moves to the version it landed in.

        A commit that adds vector rows also stamps the table's probe law when
        one is due on the base it lands on (``vector.calibrate``: the first
        vector commit, a new grid, or a table grown twofold since the law
        was measured). A request rebuilt on a newer base (``rebuild``, a
        lost race) is stamped again for that base; its rows are measured once.

        Args:
            request: the request (its ``add_entries`` are written already).
            rebuild: ``base -> request`` on that base, or None when nothing
                is left to commit (see ``Manifest.commit``).
            **kwargs: ``max_retries``, ``base``: as for ``Manifest.commit``.
        """
        law = self._writer.commit_law(request)
        if law is not None:
            inner = rebuild

            def rebuild(base: Snapshot) -> Optional[CommitRequest]:
                req = request if inner is None else inner(base)
                return None if req is None else self._writer.with_probe_law(req, base, law)

        self._snapshot = self._manifest.commit(request, rebuild=rebuild, **kwargs)
        return self._snapshot.version

    def commit_superfiles(self, entries: Sequence[dict], mutation: Optional[Mutation] = None,
                          *, grids: Iterable[dict] = (),
                          max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Commits uploaded superfiles, and what ``mutation`` removes, as one commit.

        The last step of every write (``append``, ``upsert``, ``delete`` and
        the Beam ``WriteToSupertable``): the one place where a write meets
        the commit loop. On every base the loop tries, the superfiles are put
        on the base's grid (``writer.GridAgreement``: rebuilt, same ``_id`` s,
        if they were built against another one) and the mutation resolves its
        rows, so a lost race of any kind is one retry of the same loop.

        Args:
            entries: manifest entries of uploaded, uncommitted superfiles
                (``write_superfiles``, ``writer.build_and_upload``).
            mutation: what the commit is (operation, token, metadata,
                frontier, keys or filter); by default a plain append.
            grids: the stamps (``train_grid``) of grids the entries were
                built against that the table may not hold yet.

        Returns:
            The version holding the commit (this handle moves to it); see
            ``snapshot.deduplicated`` for a token that had already landed.
        """
        return self._writer.commit_superfiles(entries, mutation, grids=grids,
                                              max_retries=max_retries)

    def optimize(self, *, target_file_bytes: int = 64 * 2**20, max_cell_rows: Optional[int] = None,
                 max_rewrite_bytes: Optional[int] = None, dry_run: bool = False,
                 vacuum_after: bool = False, older_than: Optional[datetime.timedelta] = None,
                 retain_versions: int = 10, progress: Optional[Callable[[int, int], None]] = None,
                 token: Optional[str] = None) -> Union[int, None, "OptimizePlan"]:
        """Compacts superfiles by cell, drops deleted rows and splits big cells, in one commit.

        Small superfiles and superfiles with deleted rows are rewritten,
        their live rows grouped by cell into superfiles of about
        ``target_file_bytes``; cells holding more than ``max_cell_rows`` live
        rows are split by k-means into sub-cells (the grid grows; superfiles
        of the older grid stay readable and searchable). Every row keeps its
        ``_id`` and values, and every read gives the same rows before and
        after. See :mod:`beam_supertable.table.optimize`.

        Appends that land meanwhile never conflict; deletes and upserts that
        land on a superfile being rewritten are carried over to its new
        superfiles by ``_id``.

        Args:
            target_file_bytes: the size rewritten superfiles aim at (64 MiB).
            max_cell_rows: split cells with more live rows; default
                ``max(256, 2·sqrt(live rows))`` (``optimize.default_max_cell_rows``).
            max_rewrite_bytes: rewrite at most about this many bytes of
                superfiles in this call (a huge table is optimized over
                several calls); at least one unit of work is done.
            dry_run: write nothing; return the ``OptimizePlan``.
            vacuum_after: after a successful optimize (one with nothing to do
                included; not a dry run), ``vacuum(retain_versions=...,
                older_than=...)`` (``older_than=None``: the default grace, 6 h).
            retain_versions: for ``vacuum_after``.
            progress: called with ``(groups done, groups)`` as groups are rewritten.
            token: idempotency token (default: one derived from the plan).

        Returns:
            The new version; None when there was nothing to do (nothing is
            written); the plan with ``dry_run``.
        """
        from beam_supertable.table import optimize as opt
        if vacuum_after and not dry_run:
            # Check the vacuum's options before anything is committed: a bad
            # one raised after the optimize's commit would report a call that
            # did change the table as failed.
            if isinstance(retain_versions, bool) or not isinstance(retain_versions, int) \
                    or retain_versions < 1:
                raise ValueError(f"optimize: retain_versions must be an int >= 1, "
                                 f"got {retain_versions!r}")
            grace_seconds(older_than)
        result = opt.optimize(self, target_file_bytes=target_file_bytes,
                              max_cell_rows=max_cell_rows, max_rewrite_bytes=max_rewrite_bytes,
                              dry_run=dry_run, progress=progress, token=token)
        if vacuum_after and not dry_run:
            # Also when there was nothing to optimize: the call succeeded, and
            # what earlier versions left behind is still reclaimed on schedule.
            self.vacuum(retain_versions=retain_versions, older_than=older_than)
        return result

    # -- schema changes (table/evolve.py) --------------------------------------
    def add_columns(self, fields: Union[pa.Field, Sequence[pa.Field], pa.Schema], *,
                    max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Adds nullable columns in one metadata-only commit; returns the new version.

        Existing rows read null in them; each takes a new field id (a dropped
        name added again is a new column: its old values never come back).

        Raises:
            SchemaMismatchError: a column already there, not nullable, named
                with a leading ``_``, or without an Iceberg type on an Iceberg table.
        """
        return evolve.add_columns(self, fields, max_retries=max_retries)

    def drop_columns(self, names: Union[str, Sequence[str]], *,
                     max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Drops columns in one metadata-only commit; returns the new version.

        Older versions still read them; ``optimize`` leaves their data out of
        what it rewrites.

        Raises:
            SchemaMismatchError: an unknown column, or a primary-key, vector or
                text index column.
        """
        return evolve.drop_columns(self, names, max_retries=max_retries)

    def rename_column(self, old: str, new: str, *,
                      max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Renames a column (its field id stays) in one metadata-only commit.

        Raises:
            SchemaMismatchError: an unknown ``old``, a taken ``new``, or a
                primary-key, vector or text index column.
        """
        return evolve.rename_column(self, old, new, max_retries=max_retries)

    def alter_column(self, name: str, type: pa.DataType, *,  # noqa: A002
                     max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Widens a column's type in one metadata-only commit; returns the new version.

        Widenings: int8→int16→int32→int64, float32→float64, a decimal's
        precision up (same scale), string→large_string. The same type is a
        no-op (nothing committed).

        Raises:
            SchemaMismatchError: a narrowing or another change, an unknown
                column, or a primary-key, vector or text index column.
        """
        return evolve.alter_column(self, name, type, max_retries=max_retries)

    # -- reading ---------------------------------------------------------
    def superfiles(self) -> List[dict]:
        return self._snapshot.entries()

    def _reader(self, entry: dict, schema: Optional[pa.Schema] = None) -> SuperfileReader:
        def load():
            reader = SuperfileReader(self._store, entry, self.io, self._cache)
            return reader, reader.nbytes

        # Seen through this version's schema: by field id, renamed, widened, new columns null.
        return fields.resolve(self._cache.get_or_load(("reader", entry["path"]), load),
                              self._resolution() if schema is None else fields.Resolution(
                                  schema, fields.name_mapping(schema, self._snapshot.properties)))

    def _resolution(self) -> "fields.Resolution":
        found = getattr(self, "_resolved", None)
        if found is None or found[0] is not self._snapshot:
            found = self._resolved = (self._snapshot, fields.Resolution(
                self.schema, fields.name_mapping(self.schema, self._snapshot.properties)))
        return found[1]

    def _deleted_rows(self, entry: dict, snapshot: Optional[Snapshot] = None) -> np.ndarray:
        paths = tuple((snapshot or self._snapshot).deletes.get(entry["id"], ()))
        if not paths:
            return np.zeros(0, np.int64)

        def load():
            rows = np.unique(np.concatenate(
                [dv.decode(self._store.get(p), f"{self.uri}/{p}") for p in paths]))
            return rows, rows.nbytes

        return self._cache.get_or_load(("deleted",) + paths, load)

    def _deleted_text(self, entry: dict) -> Tuple[np.ndarray, int]:
        """A superfile's deleted rows and their total token length (BM25's
        statistics count live rows only); once per set of deletion vectors."""
        paths = tuple(self._snapshot.deletes.get(entry["id"], ()))
        if not paths:
            return np.zeros(0, np.int64), 0

        def load():
            gone = self._deleted_rows(entry)
            length = text_search.deleted_length(self._reader(entry).text_index(), gone)
            return (gone, length), gone.nbytes + 64

        return self._cache.get_or_load(("deleted-text",) + paths, load)

    def _bloom(self, entry: dict) -> bytes:
        def load():
            bits = fts_index.bloom_bits(entry["text"]["bloom"])
            return bits, len(bits)

        return self._cache.get_or_load(("bloom", entry["id"]), load)

    def to_arrow(self, columns: Optional[Sequence[str]] = None,
                 filter: Optional[pc.Expression] = None) -> pa.Table:  # noqa: A002
        """Rows of this version (with ``_id`` unless ``columns`` leaves it out).

        Superfiles whose column statistics rule the filter out are not read.
        """
        names = list(columns) if columns else self.schema.names
        unknown = [c for c in names if c not in self.schema.names]
        if unknown:
            raise SchemaMismatchError(f"{self.uri}: unknown column(s) {unknown}")
        out = [self.read_superfile(e, names, filter)
               for e in pruned(self.superfiles(), filter, self.schema)]
        if not out:
            return pa.schema([self.schema.field(c) for c in names]).empty_table()
        return pa.concat_tables(out)

    def read_superfile(self, entry: dict, columns: Sequence[str],
                       filter: Optional[pc.Expression] = None) -> pa.Table:  # noqa: A002
        """One superfile's live rows, projected and filtered."""
        # Without a filter only the asked-for columns are read; a filter may
        # name any column, so then the whole row is read.
        table = self._reader(entry).read(None if filter is not None else columns)
        gone = self._deleted_rows(entry)
        if len(gone):
            keep = np.ones(table.num_rows, dtype=bool)
            keep[gone] = False
            table = table.filter(pa.array(keep))
        if filter is not None:
            table = table.filter(pa.array(mask(table, filter)))
        return table.select(list(columns))

    def count_rows(self, filter: Optional[pc.Expression] = None) -> int:  # noqa: A002
        if filter is None:
            return self._snapshot.totals.get("rows", 0) - self._snapshot.totals.get("deleted", 0)
        return self.to_arrow(columns=[ID], filter=filter).num_rows

    # -- search ------------------------------------------------------------
    def search(self, vector=None, text: Optional[str] = None, k: int = 10,
               nprobe: Optional[int] = None, filter: Optional[pc.Expression] = None,  # noqa: A002
               columns: Optional[Sequence[str]] = None, *,
               recall_target: Optional[float] = None) -> pa.Table:
        """Nearest neighbours, BM25 matches, or both fused by reciprocal rank.

        Args:
            vector: one query (1-D) or a batch (2-D); a batch returns one table
                with a ``_query`` column.
            text: words rank by BM25 (OR); ``+word`` requires a word; ``"a b"``
                requires the phrase.
            k: results per query (> 0).
            nprobe: the most cells a vector query probes (a positive int).
            filter: a pyarrow expression rows must pass.
            columns: user columns to return (default: all).
            recall_target: the recall@10 vector queries should reach, in
                (0, 1] (default 0.95); the table's probe law, measured on its
                own rows when it was written, says how many cells that takes.
                1.0 probes every cell. Give this or ``nprobe``, not both.

        Returns:
            The user columns, ``_id``, and ``_distance`` (vector; smaller is
            closer) and/or ``_score`` (text BM25; hybrid: the fused score).
        """
        return self._searcher.search(vector, text, k, nprobe, filter, columns,
                                     recall_target=recall_target)

    # -- the change feed ---------------------------------------------------
    def changes(self, start_version: Optional[int] = None,
                end_version: Union[int, str, None] = None, *,
                columns: Optional[Sequence[str]] = None,
                filter: Optional[pc.Expression] = None,  # noqa: A002
                consolidate: bool = False, consumer: Optional[str] = None) -> pa.Table:
        """Every logical change of versions ``start_version + 1 … end_version``.

        One row per row a version inserted (``_change`` = +1) and per row it
        retracted (``_change`` = −1), with the version (``_version``) and its
        commit time (``_commit_timestamp``, UTC), the row's ``_id`` and the
        user columns asked for, in version order, retractions first within a
        version. An upsert that replaces a key yields the old row's retraction
        and the new row's insertion; a delete yields retractions; an append
        insertions; ``optimize`` (rows rewritten under their own ``_id`` s) and
        ``vacuum`` nothing. Replaying the changes on the rows of
        ``start_version`` gives the rows of every later version of the range.

        Only what the range touched is read: the columns asked for of the
        superfiles it added, and the row groups holding the rows its new
        deletion vectors name; never a whole snapshot. A ``filter`` skips
        superfiles by their statistics, as ``to_arrow`` does.

        Args:
            start_version: the version the changes start from (exclusive).
            end_version: the last version included (default, or ``"latest"``:
                the latest).
            columns: user columns to return (default: all); ``_id`` always is.
            filter: a pyarrow expression the changed rows must satisfy.
            consolidate: drop changes that cancel inside the range (per
                ``_id``, or per primary key on a keyed table, whose rows are
                compared on their user columns, without ``_id``), leaving
                exactly ``rows(end) − rows(start)`` as a multiset difference.
            consumer: a name (letters, digits, ``.``, ``_``, ``-``) under which the
                table records how far this reader has read. Its first read
                starts after ``start_version`` and registers it there; later
                reads start after the version it recorded (``start_version``
                is then ignored) and every read records ``end_version``. Vacuum
                keeps every version a live consumer still needs (see
                ``consumers``). The position moves when the read returns: a job
                that fails before it has used the rows reads on after them.

        Returns:
            A ``pyarrow.Table``: ``_id``, the columns, ``_change`` (int8),
            ``_version`` (int64), ``_commit_timestamp`` (timestamp[us, UTC]);
            empty, with that schema, when the range changed nothing.

        Raises:
            ValueError: ``start_version > end_version``, not an int, or a column
                asked for twice.
            VersionNotFoundError: a version past the latest, or ``start_version``
                (or the consumer's version) removed by ``vacuum`` (the message
                names the oldest version still readable).
            SchemaMismatchError: an unknown column, a filter the columns cannot
                evaluate, an overwrite in the range that gave the table another
                schema, or a row the schema of the range's end cannot hold (a
                restore narrowed its column); the message names the version.
        """
        if consumer is not None:
            return feed_consumers.read(self, consumer, start_version, end_version,
                                       columns=columns, filter=filter,
                                       consolidate_changes=consolidate)
        return change_feed.changes(self, start_version, end_version, columns=columns,
                                   filter=filter, consolidate_changes=consolidate)

    def consumers(self) -> List[Consumer]:
        """The change feed's named consumers, by name: each one's ``version`` (the last
        whose changes it has taken), ``updated_at``, ``age`` and whether it has
        ``expired`` (silent for ``consumer_expiry``: it holds no versions).

        ``vacuum`` keeps every version from the oldest live consumer's on.
        """
        return feed_consumers.listing(self)

    def drop_consumer(self, name: str) -> None:
        """Forgets consumer ``name``: vacuum stops holding versions for it, and a reader
        using the name again starts from its ``start_version``. A Beam reader still
        running under the name stops recording (stop it first).

        Raises:
            ConsumerNotFoundError: no consumer of that name (a ``LookupError``).
        """
        feed_consumers.drop(self, name)

    @property
    def consumer_expiry(self) -> datetime.timedelta:
        """How long a consumer that records nothing keeps holding versions from vacuum
        (the table property ``consumer_expiry``; 7 days unless set)."""
        return datetime.timedelta(seconds=consumer_expiry_of(self._snapshot.properties))

    def set_consumer_expiry(self, expiry: Duration, *,
                            max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Changes the table's ``consumer_expiry`` (seconds or a ``timedelta``) in one
        commit; returns the version holding it (this handle's, when unchanged)."""
        seconds = expiry_seconds(expiry)
        self.refresh()
        if self._snapshot.properties.get(CONSUMER_EXPIRY) == seconds:
            return self.version
        return self.commit(CommitRequest(
            operation="set_properties", set_properties={CONSUMER_EXPIRY: seconds},
            replace_properties=(CONSUMER_EXPIRY,)), max_retries=max_retries)

    # -- tags ----------------------------------------------------------------
    @property
    def tags(self) -> "_tags.Tags":
        """The table's tags: names for versions, kept by ``vacuum`` until deleted
        (``create(name, version)``, ``delete(name)``, ``list()`` -> name: version,
        ``get_version(name)``, ``update(name, version)``)."""
        return _tags.Tags(self._manifest)

    # -- maintenance -------------------------------------------------------
    @property
    def token_retention(self) -> datetime.timedelta:
        """How long after a commit its token is remembered (the table property
        ``token_retention``; 7 days unless set)."""
        return datetime.timedelta(seconds=token_retention_of(self._snapshot.properties))

    def token_horizon(self) -> datetime.datetime:
        """Reruns of commits made at or after this moment (UTC) are deduplicated now."""
        at = self._manifest.clock() - token_retention_of(self._snapshot.properties)
        return datetime.datetime.fromtimestamp(at, datetime.timezone.utc)

    def set_token_retention(self, retention: Duration, *,
                            max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Changes the table's ``token_retention`` (seconds or a ``timedelta``) in one
        commit; returns the version holding it (this handle's, when unchanged).

        A longer retention keeps tokens that the next vacuum would have
        forgotten; it cannot bring back those an earlier vacuum removed. The
        change rules the commits and vacuums that start after it commits: a
        shorter one forgets at once the tokens past its horizon.
        """
        seconds = retention_seconds(retention)
        self.refresh()
        if self._snapshot.properties.get(TOKEN_RETENTION) == seconds:
            return self.version
        return self.commit(CommitRequest(
            operation="set_properties", set_properties={TOKEN_RETENTION: seconds},
            replace_properties=(TOKEN_RETENTION,)), max_retries=max_retries)

    def vacuum(self, *, retain_versions: int = 10,
               older_than: Union[float, datetime.timedelta, None] = None,
               dry_run: bool = False,
               token_retention: Union[Duration, None] = None,
               keep_versions: Sequence[int] = ()) -> VacuumReport:
        """Deletes versions and objects no retained version needs, and the token
        markers and index objects past the token horizon (see ``Manifest.vacuum``).

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period (seconds or ``timedelta``); ``None`` means
                the default grace (6 hours), ``0`` none.
            dry_run: report what would go without deleting it.
            token_retention: how long tokens are remembered (seconds or a
                ``timedelta``). Given, it becomes the table's ``token_retention``
                first (one commit when it changes; not with ``dry_run``), so
                every later version records the horizon in force.
            keep_versions: versions kept whatever their age, with every
                object they reference (e.g. the version a streaming
                ``UpsertToSupertable`` run started on: it reads priors there).

        Every version from the oldest live change-feed consumer's on is kept
        too (see ``consumers``); the report lists the consumers and the
        versions and bytes only they hold.
        """
        if token_retention is not None:
            retention_seconds(token_retention)
            if not dry_run:
                self.set_token_retention(token_retention)
        return self._manifest.vacuum(retain_versions=retain_versions, older_than=older_than,
                                     dry_run=dry_run, token_retention=token_retention,
                                     keep_versions=keep_versions)

    # -- other engines -----------------------------------------------------
    def iceberg_metadata_location(self, version: Union[int, str, None] = None) -> str:
        """The absolute URI of the Iceberg metadata file whose current snapshot is ``version``.

        ``pyiceberg.table.StaticTable.from_metadata(location)``, DuckDB's
        ``iceberg_scan(location)`` and Spark open it as they are. A commit does
        not wait for its metadata (its process writes it right after, on a
        thread of its own): this waits for what this process queued for the
        table, and writes what is still missing (a crash left it unwritten; it
        is a function of the version).

        Args:
            version: a version of the table or a tag's name (default: this handle's).

        Raises:
            IcebergDisabledError: the table keeps no Iceberg metadata; run
                ``sync_iceberg()`` (``beam-supertable iceberg sync``) once.
            VersionNotFoundError: no such version (or vacuumed).
            CorruptManifestError: the metadata file is there but unreadable.
        """
        version = _tags.resolve(self._store, version)
        snapshot = self._snapshot if version is None or version == self.version \
            else self._manifest.load(version)
        if not iceberg_meta.is_enabled(snapshot):
            raise IcebergDisabledError(
                f"{self.uri}: version {snapshot.version} keeps no Iceberg metadata (the table "
                "was created with iceberg=False or by an older release); run "
                "Supertable.sync_iceberg() or `beam-supertable iceberg sync --table URI` once")
        path = self._manifest.view(iceberg_meta.IcebergMetadata).ensure(snapshot)
        return f"{iceberg_meta.table_location(self.store)}/{path}"

    def sync_iceberg(self) -> str:
        """Turns the Iceberg metadata on (a commit, when it is off) and writes it for the
        latest version; returns that version's metadata location.

        Every later commit writes its own. The latest version's metadata is
        checked object by object: one that is missing or unreadable (a manifest
        deleted by hand, a torn file) is written again. Idempotent: a table
        whose metadata is whole writes nothing.

        Raises:
            SchemaMismatchError: a column has no Iceberg type (it names it).
        """
        self.refresh()
        if not iceberg_meta.is_enabled(self._snapshot):
            iceberg_meta.check_schema(self.uri, self.schema)
            snapshot = self._manifest.commit(CommitRequest(
                operation="iceberg",
                set_properties={iceberg_meta.ENABLED_PROPERTY: dict(iceberg_meta.ENABLED_VALUE)}))
            self._snapshot = snapshot
        path = self._manifest.view(iceberg_meta.IcebergMetadata).repair(self._snapshot)
        return f"{iceberg_meta.table_location(self.store)}/{path}"

    def to_pyarrow_dataset(self, version: Optional[int] = None) -> "LiveRows":
        """The live rows of ``version`` (default: this handle's) for DuckDB and Polars.

        The result implements the Arrow PyCapsule stream interface
        (``__arrow_c_stream__``: ``duckdb.sql("select ... from rows")``,
        ``polars.DataFrame(rows)``, ``pyarrow.table(rows)``), and the part of
        ``pyarrow.dataset.Dataset`` that ``polars.scan_pyarrow_dataset`` calls
        (``schema``, ``to_table``, ``scanner``, ``to_batches``, ``count_rows``), so Polars pushes
        projections and filters down: superfiles whose statistics rule a
        filter out are not read, and only the asked-for columns are. Deleted
        rows are never returned.
        """
        table = self if version is None or version == self.version else self.checkout(version)
        return LiveRows(table)


# Names this module re-exported before the package's folders.
__getattr__ = old_names(__name__, (_search.__name__, _writes.__name__))
