"""How a table handle writes: superfiles uploaded once, one commit per write."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable.errors import MemoryBudgetError, SchemaMismatchError
from beam_supertable.format.fields import field_id
from beam_supertable.format.keys import KeyBatch
from beam_supertable.format.manifest import DEFAULT_MAX_RETRIES, CommitRequest, Snapshot
from beam_supertable.format.schema import Data, conform
from beam_supertable.vector.metric import vectors_of
from beam_supertable.format.writer import GridAgreement, write_superfiles
from beam_supertable.table.mutation import Mutation, check_frontier
from beam_supertable.vector import calibrate
from beam_supertable.vector import grid as grid_mod

APPEND_MEMORY_FACTOR = 4   # peak bytes of an append ≈ this × the input's Arrow bytes


class Writer:
    """The write path of one table handle: validate, upload superfiles once, and
    commit them with what a mutation removes, rebuilt on every base the commit
    loop tries. The handle's ``commit`` is the one place it moves the handle."""

    def __init__(self, table: Any) -> None:   # the Supertable it serves
        # Weak: a handle and its caches go as soon as the handle is dropped.
        self.table = weakref.proxy(table)
        self._written: Optional[tuple] = None   # (entry ids, rows) of the commit under way
        self.last_rows = self.last_removed = 0   # rows given, rows replaced by the last write

    def write(self, data: Data, operation: str, *, token, metadata, frontier, max_retries,
               n_shards, memory_budget_bytes) -> int:
        """append and upsert: validate, upload once, commit with keys resolved per base."""
        frontier = self.frontier_arg(frontier, token)
        vp = self.table._vector_props()
        table = conform(self.table.uri, data, self.table.user_schema, vp["column"] if vp else None)
        if memory_budget_bytes is not None:
            need = table.nbytes * APPEND_MEMORY_FACTOR
            if need > memory_budget_bytes:
                raise MemoryBudgetError(
                    f"{self.table.uri}: {operation} of {table.num_rows:,} rows needs about {need:,} "
                    f"bytes ({APPEND_MEMORY_FACTOR}x its {table.nbytes:,} Arrow bytes); the "
                    f"budget is {memory_budget_bytes:,}. Write in smaller batches.")
        keys = None
        if self.table.primary_key:
            keys = KeyBatch(table, self.table.primary_key)
            keys.check_unique(self.table.uri, operation)
        mutation = Mutation(self.table, operation, keys=keys, refuse_live=operation == "append",
                            frontier=frontier, token=token, metadata=metadata,
                            base_version=self.table.version)
        self.last_rows, self.last_removed = table.num_rows, 0
        if table.num_rows == 0 and frontier is None:
            return self.table.version
        if operation == "append" and keys is not None and token is None:
            # Refuse live keys before uploading anything; the commit checks
            # again on the version it lands on. (With a token, the commit
            # first looks for the token: a retried append that already
            # landed finds its own keys live.)
            mutation.request(self.table._snapshot)
        # Through the table: a subclass's write_superfiles and commit_superfiles apply.
        entries, stamp = self.table.write_superfiles(table, n_shards=n_shards, conformed=True)
        # The probe law of this commit samples these rows, not read back.
        self._written = (frozenset(e["id"] for e in entries), table)
        version = self.table.commit_superfiles(entries, mutation, grids=stamp.values(),
                                               max_retries=max_retries)
        self.last_removed = mutation.removed_rows
        return version

    def frontier_arg(self, frontier, token: Optional[str]) -> Optional[int]:
        """``frontier`` checked for type and, before anything is written, against
        this handle's version (with a token, the commit checks it after looking
        for the token: a retry of a commit that landed returns that version)."""
        if frontier is None:
            return None
        if isinstance(frontier, bool) or not isinstance(frontier, (int, np.integer)):
            raise TypeError(f"{self.table.uri}: frontier must be an int (microseconds since the "
                            f"epoch) or None, got {frontier!r}")
        frontier = int(frontier)
        if token is None:
            check_frontier(self.table.uri, frontier, self.table.frontier, self.table.version)
        return frontier

    def write_superfiles(self, data: Data, *, n_shards: Optional[int] = None,
                         conformed: bool = False) -> tuple:
        """Uploads superfiles of ``data`` (see ``Supertable.write_superfiles``)."""
        vp = self.table._vector_props()
        table = data if conformed else conform(
            self.table.uri, data, self.table.user_schema, vp["column"] if vp else None)
        stamp, centroids, grid_id = {}, None, None
        if vp is not None and table.num_rows:
            centroids = self.table.grid()
            if centroids is None:
                centroids, grid_ref = self.table.train_grid(vectors_of(table, vp["column"], vp["dim"]))
                stamp = {"grid": grid_ref}
            grid_id = (stamp.get("grid") or self.table._snapshot.properties["grid"])["sha256"]
        if table.num_rows == 0:
            return [], stamp
        return write_superfiles(self.table._store, table, self.table.layout(), centroids, grid_id,
                                n_shards), stamp

    def commit_superfiles(self, entries: Sequence[dict], mutation: Optional[Mutation] = None,
                          *, grids: Iterable[dict] = (),
                          max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Commits uploaded superfiles (see ``Supertable.commit_superfiles``)."""
        if mutation is None:
            mutation = Mutation(self.table, "append", base_version=self.table.version)
        agreement = GridAgreement(
            self.table._store, self.table.layout(),
            lambda entry: self.table.read_superfile(entry, self.table.schema.names), entries, grids)

        written_with = self.table.schema

        def rebuild(base: Snapshot) -> Optional[CommitRequest]:
            _check_columns_held(self.table.uri, written_with, base, entries)
            stamp, ready = agreement.on(base)
            return mutation.request(base, entries=ready, stamp=stamp)

        return self.table.commit(mutation.draft(entries), max_retries=max_retries, rebuild=rebuild)

    def commit_law(self, request: CommitRequest) -> Optional[calibrate.CommitLaw]:
        """The probe-law measurement of a request adding vector rows, else None."""
        written, self._written = self._written, None
        vp = self.table._vector_props()
        if vp is None or not request.add_entries:
            return None

        def read_vectors(entry: dict, rows: np.ndarray) -> np.ndarray:
            # One GET of the new superfile, not a ranged read per row group.
            data = self.table._store.get(entry["path"])
            col = pq.read_table(pa.BufferReader(data), columns=[vp["column"]])
            return vectors_of(col, vp["column"], vp["dim"])[rows]

        # Rows this handle just wrote are sampled in memory, not read back.
        held = written[1] if written is not None and \
            {e["id"] for e in request.add_entries} <= written[0] else None
        return calibrate.CommitLaw(
            vp["metric"], request.add_entries, read_vectors,
            None if held is None else
            (lambda rows: vectors_of(held.take(pa.array(rows)), vp["column"], vp["dim"])))

    def with_probe_law(self, request: CommitRequest, base: Snapshot,
                        law: calibrate.CommitLaw) -> CommitRequest:
        """``request`` stamped with the probe law due on ``base`` (if any)."""
        grid = request.set_properties.get("grid") or base.properties.get("grid")
        if grid is None:
            return request

        def centroids() -> np.ndarray:
            if self.table._grid is not None and self.table._grid[0] == grid["sha256"]:
                return self.table._grid[1]
            return grid_mod.from_bytes(self.table._store.get(grid["path"]))

        doc = law.for_base(base.properties.get(calibrate.LAW_PROPERTY), grid["sha256"],
                           base.totals.get("rows", 0), centroids)
        if doc is None:
            return request
        return dataclasses.replace(
            request, set_properties={**request.set_properties, calibrate.LAW_PROPERTY: doc},
            replace_properties=tuple(request.replace_properties) + (calibrate.LAW_PROPERTY,))


def _check_columns_held(uri: str, written_with: pa.Schema, base: Snapshot,
                        entries: Sequence[dict]) -> None:
    """Refuses superfiles holding values of a column the base no longer has
    under the field id they were written with (dropped, or dropped and added
    again, by a concurrent writer): committed, those values would be lost."""
    if written_with is base.schema or not entries:
        return
    held = {field_id(f) for f in base.schema}
    for f in written_with:
        fid = field_id(f)
        if fid is None or fid in held:
            continue
        if any((e.get("field_ids") or {}).get(f.name) == fid
               and (e.get("null_counts") or {}).get(f.name, e["rows"]) < e["rows"]
               for e in entries):
            raise SchemaMismatchError(
                f"{uri}: column {f.name!r} (field id {fid}) holds values in this write, but "
                f"the table at version {base.version} no longer has it (a concurrent schema "
                "change dropped it); nothing was committed: refresh() and write again")
