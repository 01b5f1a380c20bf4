"""``Supertable``: create, open, append, read, search, delete, history, vacuum."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
from typing import (
    TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal, Optional, Sequence, Tuple,
    Union)

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from beam_supertable import deletes as dv
from beam_supertable.errors import (
    MemoryBudgetError, NotATableError, SchemaMismatchError, SupertableError, TableExistsError)
from beam_supertable.keys import KeyBatch, check_primary_key
from beam_supertable.manifest import (
    DEFAULT_MAX_RETRIES, CommitRequest, Manifest, Snapshot, VacuumReport, grace_seconds)
from beam_supertable.cache import DEFAULT_CACHE_BYTES, ByteCache
from beam_supertable.filters import mask, pruned
from beam_supertable.fts import index as fts_index
from beam_supertable.mutation import FRONTIER, Mutation, check_frontier
from beam_supertable.fts import search as text_search
from beam_supertable.reader import IOStats, SuperfileReader
from beam_supertable.schema import ID, Data, conform, vector_dim
from beam_supertable.store import ObjectStore
from beam_supertable.superfile import VectorSpec, vectors_of
from beam_supertable.vector import calibrate
from beam_supertable.vector import dense as dense_mod
from beam_supertable.vector.dense import DenseIndex
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector import search as vector_search
from beam_supertable.vector.metric import check_metric, nearest, prepare
from beam_supertable.writer import (
    TARGET_SUPERFILE_BYTES, GridAgreement, Layout, write_superfiles)

if TYPE_CHECKING:
    from beam_supertable.optimize import OptimizePlan

__all__ = ["CREATE_MODES", "CreateMode", "Metric", "Supertable"]

CreateMode = Literal["create", "exist_ok", "overwrite"]
CREATE_MODES = ("create", "exist_ok", "overwrite")
Metric = Literal["l2", "cosine", "dot"]

_LOG = logging.getLogger(__name__)
APPEND_MEMORY_FACTOR = 4   # peak bytes of an append ≈ this × the input's Arrow bytes


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
        self._lineage: Dict[tuple, Optional[np.ndarray]] = {}
        self._law_cache: tuple = (None, None)
        self._dense_memo: tuple = (None, None, None, None, None)
        self._result_schema: tuple = (None, None, None)
        self._entry_cells: Dict[str, frozenset] = {}
        self._written: Optional[tuple] = None   # (entry ids, rows) of the commit under way
        self.io = IOStats()

    # -- opening ---------------------------------------------------------
    @classmethod
    def create(cls, uri: str, schema: pa.Schema, *, vector_column: Optional[str] = None,
               metric: Metric = "l2", fts_columns: Sequence[str] = (),
               n_cells: Optional[int] = None, storage_options: Optional[dict] = None,
               mode: CreateMode = "create", replica_factor: float = 0.0, stop_words: Sequence[str] = (),
               target_superfile_bytes: int = TARGET_SUPERFILE_BYTES,
               single_writer: bool = False,
               cache_bytes: int = DEFAULT_CACHE_BYTES,
               primary_key: Union[str, Sequence[str], None] = None) -> "Supertable":
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
            stop_words: words the tokenizer drops (none by default).
            cache_bytes: the handle's read cache budget (see the class note).
        """
        if mode not in CREATE_MODES:
            raise ValueError(f"{uri}: mode must be one of {CREATE_MODES}, got {mode!r}")
        full, props = cls.describe_create(
            uri, schema, vector_column=vector_column, metric=metric, fts_columns=fts_columns,
            n_cells=n_cells, replica_factor=replica_factor, stop_words=stop_words,
            target_superfile_bytes=target_superfile_bytes, primary_key=primary_key)
        store = ObjectStore(uri, storage_options, single_writer=single_writer)
        manifest = Manifest(store)
        if mode == "exist_ok":
            # Read first: opening a table that is there writes nothing.
            try:
                table = cls(store, manifest.load(), cache_bytes=cache_bytes)
            except NotATableError:
                pass
            else:
                table._check_settings(full, props)
                return table
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
        table._check_settings(full, props)
        return table

    @staticmethod
    def describe_create(uri: str, schema: pa.Schema, *, vector_column: Optional[str] = None,
                        metric: Metric = "l2", fts_columns: Sequence[str] = (),
                        n_cells: Optional[int] = None, replica_factor: float = 0.0,
                        stop_words: Sequence[str] = (),
                        target_superfile_bytes: int = TARGET_SUPERFILE_BYTES,
                        primary_key: Union[str, Sequence[str], None] = None
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
            props["fts"] = {"columns": list(fts_columns),
                            "stop_words": sorted({w.casefold() for w in stop_words})}
        full = pa.schema([pa.field(ID, pa.int64(), nullable=False)] + list(schema))
        return full, props

    def _check_settings(self, schema: pa.Schema, props: Dict[str, Any]) -> None:
        """For ``create(mode="exist_ok")``: the table must be the one described."""
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
    def open(cls, uri: str, version: Optional[int] = None,
             storage_options: Optional[dict] = None, *,
             single_writer: bool = False,
             cache_bytes: int = DEFAULT_CACHE_BYTES) -> "Supertable":
        """Opens one version (the latest by default): a consistent snapshot.

        Args:
            cache_bytes: the handle's read cache budget (see the class note).
        """
        store = ObjectStore(uri, storage_options, single_writer=single_writer)
        return cls(store, Manifest(store).load(version), cache_bytes=cache_bytes)

    def refresh(self) -> "Supertable":
        """This handle, moved to the latest version."""
        self._snapshot = self._manifest.load()
        return self

    def checkout(self, version: int) -> "Supertable":
        """Another handle on ``version`` of the same table."""
        return Supertable(self._store, self._manifest.load(version),
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
            stop_words=frozenset(fp.get("stop_words", ())) if fp else frozenset(),
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
               memory_budget_bytes: Optional[int] = None) -> int:
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

        Raises:
            SchemaMismatchError: data that does not fit the schema; the message
                names the column and row (a null key included).
            DuplicateKeyError: on a keyed table, a repeated or live key.
            FrontierError: ``frontier`` is below the table's.
            TokenReuseError: ``token`` already landed with other rows.
            CommitFailedError: the commit did not land within ``max_retries``.
        """
        return self._write(data, "append", token=token, metadata=metadata, frontier=frontier,
                           max_retries=max_retries, n_shards=n_shards,
                           memory_budget_bytes=memory_budget_bytes)

    def upsert(self, data: Data, *, token: Optional[str] = None,
               metadata: Optional[Dict[str, Any]] = None, frontier: Optional[int] = None,
               max_retries: int = DEFAULT_MAX_RETRIES, n_shards: Optional[int] = None,
               memory_budget_bytes: Optional[int] = None) -> int:
        """Inserts rows, or replaces the live row with the same key, in one commit.

        The keys are resolved against the version the commit lands on (a lost
        race re-resolves them on the winner's version), so at every version a
        key has at most one live row and the last committer wins. The commit
        holds the new superfiles plus deletion vectors for the rows replaced;
        older versions still read their own rows. Finding the rows reads only
        the key columns of superfiles whose key range and bloom filter may
        hold one of the keys.

        Args:
            token, metadata, frontier, max_retries, n_shards,
                memory_budget_bytes: as for ``append``.

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
        return self._write(data, "upsert", token=token, metadata=metadata, frontier=frontier,
                           max_retries=max_retries, n_shards=n_shards,
                           memory_budget_bytes=memory_budget_bytes)

    def _write(self, data: Data, operation: str, *, token, metadata, frontier, max_retries,
               n_shards, memory_budget_bytes) -> int:
        """append and upsert: validate, upload once, commit with keys resolved per base."""
        frontier = self._frontier_arg(frontier, token)
        vp = self._vector_props()
        table = conform(self.uri, data, self.user_schema, vp["column"] if vp else None)
        if memory_budget_bytes is not None:
            need = table.nbytes * APPEND_MEMORY_FACTOR
            if need > memory_budget_bytes:
                raise MemoryBudgetError(
                    f"{self.uri}: {operation} of {table.num_rows:,} rows needs about {need:,} "
                    f"bytes ({APPEND_MEMORY_FACTOR}x its {table.nbytes:,} Arrow bytes); the "
                    f"budget is {memory_budget_bytes:,}. Write in smaller batches.")
        keys = None
        if self.primary_key:
            keys = KeyBatch(table, self.primary_key)
            keys.check_unique(self.uri, operation)
        mutation = Mutation(self, operation, keys=keys, refuse_live=operation == "append",
                            frontier=frontier, token=token, metadata=metadata,
                            base_version=self.version)
        if table.num_rows == 0 and frontier is None:
            return self.version
        if operation == "append" and keys is not None and token is None:
            # Refuse live keys before uploading anything; the commit checks
            # again on the version it lands on. (With a token, the commit
            # first looks for the token: a retried append that already
            # landed finds its own keys live.)
            mutation.request(self._snapshot)
        entries, stamp = self.write_superfiles(table, n_shards=n_shards, conformed=True)
        # The probe law of this commit samples these rows, not read back.
        self._written = (frozenset(e["id"] for e in entries), table)
        return self.commit_superfiles(entries, mutation, grids=stamp.values(),
                                      max_retries=max_retries)

    def _frontier_arg(self, frontier, token: Optional[str]) -> Optional[int]:
        """``frontier`` checked for type and, before anything is written, against
        this handle's version (with a token, the commit checks it after looking
        for the token: a retry of a commit that landed returns that version)."""
        if frontier is None:
            return None
        if isinstance(frontier, bool) or not isinstance(frontier, (int, np.integer)):
            raise TypeError(f"{self.uri}: frontier must be an int (microseconds since the "
                            f"epoch) or None, got {frontier!r}")
        frontier = int(frontier)
        if token is None:
            check_frontier(self.uri, frontier, self.frontier, self.version)
        return frontier

    def write_superfiles(self, data: Data, *, n_shards: Optional[int] = None,
                         conformed: bool = False) -> tuple:
        """Validates and uploads superfiles without committing them.

        Returns:
            ``(entries, properties_to_stamp)``: the manifest entries, and the
            grid stamp when this write trained the table's first grid. Commit
            them with ``commit(CommitRequest(add_entries=..., set_properties=...))``;
            uncommitted superfiles are orphans that ``vacuum`` reclaims.
        """
        vp = self._vector_props()
        table = data if conformed else conform(
            self.uri, data, self.user_schema, vp["column"] if vp else None)
        stamp, centroids, grid_id = {}, None, None
        if vp is not None and table.num_rows:
            centroids = self.grid()
            if centroids is None:
                centroids, grid_ref = self.train_grid(vectors_of(table, vp["column"], vp["dim"]))
                stamp = {"grid": grid_ref}
            grid_id = (stamp.get("grid") or self._snapshot.properties["grid"])["sha256"]
        if table.num_rows == 0:
            return [], stamp
        return write_superfiles(self._store, table, self.layout(), centroids, grid_id,
                                n_shards), stamp

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
        law = self._commit_law(request)
        if law is not None:
            inner = rebuild

            def rebuild(base: Snapshot) -> Optional[CommitRequest]:
                req = request if inner is None else inner(base)
                return None if req is None else self._with_probe_law(req, base, law)

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
        if mutation is None:
            mutation = Mutation(self, "append", base_version=self.version)
        agreement = GridAgreement(self, entries, grids)

        def rebuild(base: Snapshot) -> Optional[CommitRequest]:
            stamp, ready = agreement.on(base)
            return mutation.request(base, entries=ready, stamp=stamp)

        return self.commit(mutation.draft(entries), max_retries=max_retries, rebuild=rebuild)

    def _commit_law(self, request: CommitRequest) -> Optional[calibrate.CommitLaw]:
        """The probe-law measurement of a request adding vector rows, else None."""
        written, self._written = self._written, None
        vp = self._vector_props()
        if vp is None or not request.add_entries:
            return None

        def read_vectors(entry: dict, rows: np.ndarray) -> np.ndarray:
            # One GET of the new superfile, not a ranged read per row group.
            data = self._store.get(entry["path"])
            col = pq.read_table(pa.BufferReader(data), columns=[vp["column"]])
            return vectors_of(col, vp["column"], vp["dim"])[rows]

        # Rows this handle just wrote are sampled in memory, not read back.
        held = written[1] if written is not None and \
            {e["id"] for e in request.add_entries} <= written[0] else None
        return calibrate.CommitLaw(
            vp["metric"], request.add_entries, read_vectors,
            None if held is None else
            (lambda rows: vectors_of(held.take(pa.array(rows)), vp["column"], vp["dim"])))

    def _with_probe_law(self, request: CommitRequest, base: Snapshot,
                        law: calibrate.CommitLaw) -> CommitRequest:
        """``request`` stamped with the probe law due on ``base`` (if any)."""
        grid = request.set_properties.get("grid") or base.properties.get("grid")
        if grid is None:
            return request

        def centroids() -> np.ndarray:
            if self._grid is not None and self._grid[0] == grid["sha256"]:
                return self._grid[1]
            return grid_mod.from_bytes(self._store.get(grid["path"]))

        doc = law.for_base(base.properties.get(calibrate.LAW_PROPERTY), grid["sha256"],
                           base.totals.get("rows", 0), centroids)
        if doc is None:
            return request
        return dataclasses.replace(
            request, set_properties={**request.set_properties, calibrate.LAW_PROPERTY: doc},
            replace_properties=tuple(request.replace_properties) + (calibrate.LAW_PROPERTY,))

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
                            frontier=self._frontier_arg(frontier, token), token=token,
                            metadata=metadata, base_version=self.version)
        return self.commit_superfiles((), mutation, max_retries=max_retries)

    def vacuum(self, *, retain_versions: int = 10,
               older_than: Union[float, datetime.timedelta, None] = None,
               dry_run: bool = False) -> VacuumReport:
        """Deletes versions and objects no retained version needs (see ``Manifest.vacuum``).

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period (seconds or ``timedelta``); ``None`` means
                the default grace (6 hours), ``0`` none.
            dry_run: report what would go without deleting it.
        """
        return self._manifest.vacuum(retain_versions=retain_versions, older_than=older_than,
                                     dry_run=dry_run)

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
        after. See :mod:`beam_supertable.optimize`.

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
        from beam_supertable import optimize as opt
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

    # -- reading ---------------------------------------------------------
    def superfiles(self) -> List[dict]:
        return self._snapshot.entries()

    def _reader(self, entry: dict) -> SuperfileReader:
        def load():
            reader = SuperfileReader(self._store, entry, self.io, self._cache)
            return reader, reader.nbytes

        return self._cache.get_or_load(("reader", entry["path"]), load)

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
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"{self.uri}: k must be a positive int, got {k!r}")
        if vector is None and text is None:
            raise ValueError(f"{self.uri}: search needs vector=..., text=... or both")
        vector_search.check_probe_args(self.uri, nprobe, recall_target)
        names = list(self.user_schema.names if columns is None else columns)
        unknown = [c for c in names if c not in self.user_schema.names]
        if unknown:
            raise SchemaMismatchError(f"{self.uri}: unknown column(s) {unknown}")
        queries = None
        if vector is not None:
            vp = self._vector_props()
            if vp is None:
                raise SupertableError(f"{self.uri}: the table has no vector column to search")
            queries = np.asarray(vector, dtype=np.float32)
            single = queries.ndim == 1
            queries = queries[None, :] if single else queries
            if queries.ndim != 2 or queries.shape[1] != vp["dim"]:
                raise ValueError(
                    f"{self.uri}: query vector(s) must have {vp['dim']} values, got shape "
                    f"{np.asarray(vector).shape}")
            if not np.isfinite(queries).all():
                raise ValueError(f"{self.uri}: query vector holds NaN or infinity")
        else:
            single = True
        if text is not None:
            if self._fts_props() is None:
                raise SupertableError(f"{self.uri}: the table has no text columns to search")
            if not isinstance(text, str):
                raise TypeError(f"{self.uri}: text must be a string, got {type(text).__name__}")
        entries = pruned(self.superfiles(), filter, self.schema)
        allowed = self._allowed(entries, filter)
        depth = k if (queries is None or text is None) else max(k * 4, 50)
        vec = self._vector_hits(queries, depth, nprobe, entries, allowed, recall_target,
                                filtered=filter is not None) if queries is not None else None
        if text is None:
            # Vector only: the hits stay arrays, from the search to the result table.
            dist, sfs, rows = (a[:, :k].ravel() for a in vec)
            hit = rows >= 0
            if hit.all():   # (every query found k rows: nothing to drop)
                qi = np.repeat(np.arange(len(vec[0]), dtype=np.int32), k)
            else:
                hit = np.flatnonzero(hit)
                qi, dist, sfs, rows = hit // k, dist[hit], sfs[hit], rows[hit]
            return self._materialize(entries, qi, sfs, rows, names, single, dist=dist)
        fp = self._fts_props()
        txt = text_search.text_candidates(
            entries, self.superfiles(), text, depth, fp["columns"],
            frozenset(fp.get("stop_words", ())), self._reader, self._bloom, allowed,
            self._deleted_text)
        flat = []
        for qi in range(1 if queries is None else len(queries)):
            if vec is None:
                hits = [(si, row, None, s) for s, si, row in txt][:k]
            else:
                n = int((vec[2][qi] >= 0).sum())
                mine = list(zip(vec[0][qi, :n].tolist(), vec[1][qi, :n].tolist(),
                                vec[2][qi, :n].tolist()))
                dist = {(si, row): d for d, si, row in mine}
                fused = text_search.rrf([[(si, row) for _, si, row in mine],
                                         [(si, row) for _, si, row in txt]], k)
                hits = [(si, row, dist.get((si, row)), s) for s, (si, row) in fused]
            flat.extend((qi, si, row, d, s) for si, row, d, s in hits)
        qi, sis, rows, dist, score = (list(c) for c in zip(*flat)) if flat else ([],) * 5
        return self._materialize(
            entries, np.array(qi, np.int64), np.array(sis, np.int64), np.array(rows, np.int64),
            names, single, dist=dist if vec is not None else None, score=score)

    def _allowed(self, entries, filter):  # noqa: A002
        """None when every row passes; else ``allowed(superfile, rows) -> mask``."""
        if filter is None and not any(self._snapshot.deletes.get(e["id"]) for e in entries):
            return None

        def allowed(si: int, rows: np.ndarray) -> np.ndarray:
            e = entries[si]
            ok = ~np.isin(rows, self._deleted_rows(e))
            if filter is not None and ok.any():
                ok &= mask(self._reader(e).take(rows), filter)
            return ok

        return allowed

    def _vector_hits(self, queries, depth, nprobe, entries, allowed, recall_target=None,
                     filtered=False):
        """Each query's ``depth`` nearest rows: ``[Q, depth]`` distances (inf pads),
        superfiles (indexes into ``entries``) and rows (-1 pads), nearest first."""
        vp = self._vector_props()
        centroids = self.grid()
        n_q = len(queries)
        if centroids is None or not entries:
            return (np.full((n_q, depth), np.inf, np.float32), np.full((n_q, depth), -1, np.int64),
                    np.full((n_q, depth), -1, np.int64))
        metric = vp["metric"]
        q = prepare(queries, metric)
        n_cells = len(centroids)
        sha = self._snapshot.properties["grid"]["sha256"]
        law = self._probe_law()
        probe = nprobe or calibrate.nprobe_for_target(law, sha, n_cells, recall_target)
        # Bounds need every row assigned to its nearest centre of this grid.
        bounded = all(e.get("grid") == sha for e in entries if e.get("cells"))
        dense = None if filtered or not bounded else \
            self._dense(entries, sha, n_q >= dense_mod.DENSE_MIN_QUERIES)
        if dense is not None:
            if n_q == 1:
                return dense.search(q, nearest(q, centroids, metric, probe), depth)
            with vector_search.one_blas_thread():
                return dense.search(q, nearest(q, centroids, metric, probe), depth)
        out = (np.full((n_q, depth), np.inf, np.float32), np.full((n_q, depth), -1, np.int64),
               np.full((n_q, depth), -1, np.int64))
        todo = np.arange(n_q)
        if len(self._entry_cells) > 2 * self._snapshot.totals.get("superfiles", 0) + 1024:
            self._entry_cells.clear()   # (superfiles of older versions)
        by_grid = self._by_grid(entries)
        checked: List[Tuple[int, int]] = []   # (candidates checked, allowed), per check
        if allowed is not None:
            allowed = _counting(allowed, checked)
        thinned = nprobe is not None
        while len(todo):
            probes = vector_search.rank_cells(q[todo], centroids, metric, probe,
                                              bounded and calibrate.adaptive(law, sha, probe))
            parts = []
            for up, members in by_grid:
                # Superfiles of an older grid: probe the cells the probed
                # (newer, split) cells descend from.
                sub = probes if up is None else _unique_rows(
                    np.where(probes.cells >= 0, up[np.maximum(probes.cells, 0)], -1))
                wanted = set(np.unique(probes.cells if up is None else sub).tolist())
                live = [si for si in members if not wanted.isdisjoint(self._cells_of(entries[si]))]
                indexes = [self._reader(entries[si]).vector_index() for si in live]
                sub_allowed = None if allowed is None else \
                    (lambda i, rows, live=live: allowed(live[i], rows))
                dist, sfs, rows = vector_search.vector_search(
                    indexes, q[todo], sub, metric, depth, sub_allowed)
                parts.append((dist, np.asarray(live or [0])[np.maximum(sfs, 0)], rows))
            dist, sfs, rows = parts[0] if len(parts) == 1 else _best_of(parts, depth)
            out[0][todo], out[1][todo], out[2][todo] = dist, sfs, rows
            short = todo[(rows >= 0).sum(axis=1) < depth]
            if nprobe is not None or probe >= n_cells or allowed is None:
                break
            if not thinned:
                # The law counts cells for a table of every row; a filter
                # passing a share s of the rows near the queries leaves them
                # in a table s times thinner, whose nearest k lie about 1/s
                # times as many cells out: probe that many (see _thinned_nprobe).
                thinned = True
                wider = _thinned_nprobe(probe, n_cells, checked)
                if wider > probe:
                    todo, probe = np.arange(n_q), wider
                    continue
            # A selective filter left too few rows in the probed cells: widen.
            todo, probe = short, min(n_cells, probe * 2)
        return out

    def _dense(self, entries, sha: str, batch: bool) -> Optional[DenseIndex]:
        """The table's live vectors held whole (``vector.dense``), if it is small enough.

        A batch on a small table is always answered this way (whatever the
        handle's cache budget: one that cannot keep the index builds it for
        each batch), so a batch gets the same answer on every handle. A
        single query uses the index only when the handle holds it already:
        a cold query reads the few runs it probes, not the whole table.
        The index is kept in the handle's cache, keyed by the superfiles and
        their deletion vectors, so any change to the rows makes a new one.
        """
        vp = self._vector_props()
        # The key is the same for every search of a version: kept, tagged with
        # the snapshot and the entries it was made from (their first and last
        # objects, held so their ids stay theirs: a refresh racing this search
        # must not keep another version's).
        memo = self._dense_memo
        if memo[0] is not self._snapshot or memo[1] != (len(entries), id(entries[0]),
                                                        id(entries[-1])):
            mine = [(si, e) for si, e in enumerate(entries) if e.get("cells")]
            rows = sum(int(e.get("rows", 0)) for _, e in mine)
            key = None if not mine or not dense_mod.usable(rows, vp["dim"]) else (
                "dense", sha, vp["metric"],
                tuple((e["id"], tuple(self._snapshot.deletes.get(e["id"], ()))) for _, e in mine))
            memo = self._dense_memo = (self._snapshot, (len(entries), id(entries[0]),
                                                        id(entries[-1])), mine, key, entries)
        mine, key = memo[2], memo[3]
        if key is None:
            return None
        found = self._cache.get(key)
        if found is not None or not batch:
            return found
        built = dense_mod.DenseIndex.build(
            [self._reader(e) for _, e in mine], [self._deleted_rows(e) for _, e in mine],
            len(self.grid()), vp["metric"])
        # Its superfile numbers are positions in ``mine``: make them entries'.
        built.superfile = np.append(np.array([si for si, _ in mine], np.int64), -1)[built.superfile]
        return self._cache.put(key, built, built.nbytes)

    def _cells_of(self, entry: dict) -> frozenset:
        cells = self._entry_cells.get(entry["id"])
        if cells is None:
            cells = self._entry_cells[entry["id"]] = frozenset(
                entry.get("cells", ())) | frozenset(entry.get("replica_cells", ()))
        return cells

    def _probe_law(self) -> Optional[calibrate.ProbeLaw]:
        """This version's probe law (parsed once per version)."""
        doc = self._snapshot.properties.get(calibrate.LAW_PROPERTY)
        if self._law_cache[0] is not doc:
            self._law_cache = (doc, calibrate.ProbeLaw.from_json(doc))
        return self._law_cache[1]

    def _by_grid(self, entries) -> List[tuple]:
        """Entries grouped by the grid version they were written against:
        ``[(ancestor map or None for the current grid, [entry index, ...])]``."""
        stamp = self._snapshot.properties["grid"]
        if not stamp.get("lineage"):
            return [(None, list(range(len(entries))))]
        sizes = grid_mod.lineage(stamp)
        groups: Dict[int, List[int]] = {}
        for si, e in enumerate(entries):
            groups.setdefault(sizes.get(e.get("grid"), stamp["n_cells"]), []).append(si)
        out = []
        for n, members in sorted(groups.items(), reverse=True):
            key = (stamp["sha256"], n)
            if key not in self._lineage:
                self._lineage[key] = None if n == stamp["n_cells"] else grid_mod.ancestors(stamp, n)
            out.append((self._lineage[key], members))
        return out

    def _materialize(self, entries, qi: np.ndarray, sis: np.ndarray, rows: np.ndarray,
                     names, single: bool, dist=None, score=None) -> pa.Table:
        """One table of hits ``(query, superfile, row)``: each superfile read once for all
        queries' rows; ``dist`` / ``score`` (per hit) become ``_distance`` / ``_score``."""
        shape = (tuple(names), dist is not None, score is not None, single)
        memo = self._result_schema   # (searches repeat one shape: built once per version)
        if memo[0] is not self._snapshot or memo[1] != shape:
            fields = [self.schema.field(ID)] + [self.schema.field(c) for c in names]
            if dist is not None:
                fields.append(pa.field("_distance", pa.float32()))
            if score is not None:
                fields.append(pa.field("_score", pa.float32()))
            if not single:
                fields.append(pa.field("_query", pa.int32()))
            memo = self._result_schema = (self._snapshot, shape, pa.schema(fields))
        schema = memo[2]
        if not len(rows):
            return schema.empty_table()
        if not names:
            # Ids only: each hit's id straight from its superfile's ``_id`` column.
            ids = np.empty(len(rows), dtype=np.int64)
            for si in np.flatnonzero(np.bincount(sis, minlength=len(entries))).tolist():
                mask = sis == si
                ids[mask] = self._reader(entries[si]).ids_of(rows[mask])
            columns = [pa.array(ids, schema.field(0).type)]
            if dist is not None:
                columns.append(pa.array(dist, pa.float32()))
            if score is not None:
                columns.append(pa.array(score, pa.float32()))
            if not single:
                columns.append(pa.array(np.asarray(qi).astype(np.int32, copy=False), pa.int32()))
            return pa.Table.from_arrays(columns, schema=schema)
        parts, where = [], np.empty(len(rows), dtype=np.int64)
        base = 0
        for si in np.unique(sis).tolist():
            mask = sis == si
            uniq, inverse = np.unique(rows[mask], return_inverse=True)
            reader = self._reader(entries[si])
            if names:
                parts.append(reader.take(uniq, columns=[ID] + list(names)))
            else:
                parts.append(pa.table({ID: reader.ids_of(uniq)}))
            where[mask] = base + inverse
            base += len(uniq)
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        table = table.take(pa.array(where))
        if dist is not None:
            table = table.append_column("_distance", pa.array(dist, pa.float32()))
        if score is not None:
            table = table.append_column("_score", pa.array(score, pa.float32()))
        if not single:
            table = table.append_column("_query", pa.array(qi, pa.int32()))
        return table


def _best_of(parts: Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]], depth: int
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``depth`` nearest of several ``(dist, superfile, row)`` results per query
    (one per grid version), nearest first; a missing hit has row -1."""
    dist, sfs, rows = (np.concatenate([p[i] for p in parts], axis=1) for i in range(3))
    key = np.where(rows >= 0, dist, np.inf)
    order = np.argsort(key, axis=1, kind="stable")[:, :depth]
    return (np.take_along_axis(dist, order, axis=1), np.take_along_axis(sfs, order, axis=1),
            np.take_along_axis(rows, order, axis=1))


THIN_MIN_FACTOR = 1.25   # _thinned_nprobe: probe more only if the filter passes under 80%


def _counting(allowed: Callable[[int, np.ndarray], np.ndarray], log: List[Tuple[int, int]]
              ) -> Callable[[int, np.ndarray], np.ndarray]:
    """``allowed`` that also logs ``(rows checked, rows passing)`` of each call."""
    def counted(si: int, rows: np.ndarray) -> np.ndarray:
        ok = allowed(si, rows)
        log.append((len(rows), int(np.count_nonzero(ok))))   # (append: thread-safe)
        return ok

    return counted


def _thinned_nprobe(probe: int, n_cells: int, checked: Sequence[Tuple[int, int]]) -> int:
    """Cells to probe so a filter's survivors reach the recall ``probe`` cells give unfiltered.

    The share ``s`` of the candidates checked (the rows nearest the queries)
    that passed the filter estimates how thin the allowed rows are around
    the queries; cells hold about ``s`` times fewer of them, so reaching as
    many takes ``probe / s`` cells. None passing: every cell. A share above
    ``1 / THIN_MIN_FACTOR`` (a few deleted rows, a filter passing nearly
    everything) costs little recall and is not worth a second pass.
    """
    seen = sum(n for n, _ in checked)
    passed = sum(p for _, p in checked)
    if not seen or passed * THIN_MIN_FACTOR > seen:
        return probe
    if not passed:
        return n_cells
    return min(n_cells, int(math.ceil(probe * seen / passed)))


def _unique_rows(probes: np.ndarray) -> np.ndarray:
    """``probes`` with a cell repeated in a row replaced by -1 (probes nothing)."""
    order = np.sort(probes, axis=1)
    dup = np.zeros(order.shape, dtype=bool)
    dup[:, 1:] = order[:, 1:] == order[:, :-1]
    order[dup] = -1
    return order
