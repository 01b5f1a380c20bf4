"""How a table handle writes: superfiles uploaded once, one commit per write."""

from __future__ import annotations

import dataclasses
from typing import (
    Callable, Iterable, Optional, Sequence)

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable.errors import (
    MemoryBudgetError)
from beam_supertable.keys import KeyBatch
from beam_supertable.manifest import (
    DEFAULT_MAX_RETRIES, CommitRequest, Snapshot)
from beam_supertable.mutation import Mutation, check_frontier
from beam_supertable.schema import Data, conform
from beam_supertable.superfile import vectors_of
from beam_supertable.vector import calibrate
from beam_supertable.vector import grid as grid_mod
from beam_supertable.writer import (
    GridAgreement, write_superfiles)


APPEND_MEMORY_FACTOR = 4   # peak bytes of an append ≈ this × the input's Arrow bytes


class TableWrites:
    """The write path of ``Supertable`` (mixed into the table): validate, upload
    superfiles once, and commit them with what a mutation removes, rebuilt on
    every base the commit loop tries."""

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
        agreement = GridAgreement(
            self._store, self.layout(),
            lambda entry: self.read_superfile(entry, self.schema.names), entries, grids)

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
