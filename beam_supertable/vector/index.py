"""One superfile's vector index: its sections, decoded a run at a time and cached.

Bytes in (through :class:`SectionReader`), arrays out; no I/O of its own.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Hashable, List, Protocol, Sequence, Tuple

import numpy as np

from beam_supertable.vector import codes
from beam_supertable.vector._threads import read_all
from beam_supertable.vector.metric import prepare, vectors_of

# A run's state in a handle's cache (0: not loaded); FETCHED: its codes read ahead of
# the first scoring (load_codes), which then counts as the first.
SQ8_ONCE, EXACT, SQ8_AGAIN, SQ8_FETCHED = 1, 2, 3, 4
CODE_GAP_BYTES = 32 * 1024      # cold runs closer than this share one ranged read
EXACT_FIRST_RUNS = 4             # a search loading at most this many runs reads their fp32 rows


class SectionReader(Protocol):
    """What the index reads a superfile through (``reader.SuperfileReader`` is one).

    The index never opens objects itself: it asks for named sections, byte
    ranges of them and rows of the vector column, and keeps what it decodes
    in the reader's cache under the reader's keys.
    """

    header: Dict[str, Any]
    metadata: Any          # the Parquet footer (``pyarrow.parquet.FileMetaData``)
    cache: Any             # the handle's ``ByteCache``
    parallel: bool         # several reads at once pay (each is a network round trip)

    def cache_key(self, name: str) -> Hashable: ...

    def section(self, name: str) -> bytes: ...

    def section_range(self, name: str, start: int, stop: int) -> bytes: ...

    def take(self, rows: Any, columns: Sequence[str]) -> Any: ...


class _Stores:
    """One superfile's loaded runs (see :class:`VectorIndex`) and the bytes charged for them."""

    __slots__ = ("score", "exact", "state", "nbytes")

    def __init__(self, score: np.ndarray, exact: np.ndarray, state: np.ndarray) -> None:
        self.score, self.exact, self.state = score, exact, state
        self.nbytes = 0

    def arrays(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.score, self.exact, self.state


class VectorIndex:
    """One superfile's vector index sections, loaded on demand and cached.

    Two stores, filled a run at a time: the scoring store, ``[dim, entries]``
    (transposed, so a run's rows are a matrix the product with a few queries
    is fast on), holding decoded SQ8 codes, or the exact fp32 rows once the
    run has been reranked; and the exact store, ``[rows, dim]`` fp32 rows for
    reranks. A warm handle therefore scores exactly and reads nothing.

    The stores live in the handle's ``ByteCache`` (charged by the bytes
    loaded into them, evicted with everything else the handle keeps); a
    search pins them (:meth:`pinned`), so an eviction during a search frees
    them when it ends, and the next search starts from empty stores.
    """

    def __init__(self, reader: SectionReader) -> None:
        self.reader = reader
        vec = reader.header["vector"]
        self.dim = vec["dim"]
        self.column = vec["column"]
        self.metric = vec["metric"]
        self.rows = reader.header["rows"]
        self.nbytes = (self.dim + 7) // 8
        # cell -> [(start, stop, fine index)], the fine runs of the cell
        self.runs: Dict[int, List[Tuple[int, int, int]]] = {}
        for (cell, start, count, fine_start, n_fine), counts in zip(vec["cells"], vec["fine_counts"]):
            offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            self.runs[cell] = [(start + offs[j], start + offs[j + 1], fine_start + j)
                               for j in range(n_fine)]
        for cell, start, count, fine, _ in vec["replicas"]:
            self.runs.setdefault(cell, []).append((self.rows + start, self.rows + start + count, fine))
        self.cell_ids = np.array(sorted(self.runs), dtype=np.int64)
        self.has_replicas = bool(vec["replicas"])
        self.entries = self.rows + sum(r[2] for r in vec["replicas"])
        # Every run, main and replica, tiles [0, entries): where each starts and stops.
        spans = sorted(r[:2] for runs in self.runs.values() for r in runs)
        self._starts = np.array([r[0] for r in spans], dtype=np.int64)
        self._stops = np.array([r[1] for r in spans], dtype=np.int64)
        self._run_at = {start: i for i, (start, _) in enumerate(spans)}
        # Row groups are cut at cell boundaries: a run never straddles two.
        meta = reader.metadata
        self._rg_starts = np.cumsum([0] + [meta.row_group(i).num_rows
                                           for i in range(meta.num_row_groups)])
        self._lock = threading.Lock()
        self._pin = threading.local()
        self._key = reader.cache_key("vector.stores")
        self._params = None
        self._fine = None
        self._replica_rows = None

    def _fresh(self) -> _Stores:
        # np.empty: only the pages of the runs loaded are ever touched.
        return _Stores(np.empty((self.dim + 1, self.entries), dtype=np.float32),  # scoring
                       np.empty((self.rows, self.dim), dtype=np.float32),         # exact rows
                       np.zeros(len(self._starts), dtype=np.int8))   # run states, below

    def _cached(self) -> _Stores:
        """The stores in the handle's cache, or fresh ones put there."""
        cache = self.reader.cache
        stores = cache.get(self._key)
        if stores is None:
            with self._lock:
                stores = cache.get(self._key)
                if stores is None:
                    stores = cache.put(self._key, self._fresh(), 0)
        return stores

    @contextlib.contextmanager
    def pinned(self):
        """Holds this thread's stores for one search: the same ones from start to end."""
        if getattr(self._pin, "stores", None) is not None:   # (nested)
            yield
            return
        self._pin.stores = self._cached()
        try:
            yield
        finally:
            self._pin.stores = None

    def _stores(self) -> _Stores:
        stores = getattr(self._pin, "stores", None)
        return stores if stores is not None else self._cached()

    def _room(self, nbytes: int) -> _Stores:
        """The stores to fill with ``nbytes`` more, charged to the cache; hold the lock.

        Fresh stores when the handle's whole budget would not hold these
        (the old ones then go when no search pins them any more).
        """
        stores = self._stores()
        cache = self.reader.cache
        if stores.nbytes and stores.nbytes + nbytes > cache.capacity_bytes:
            stores = self._fresh()
            if getattr(self._pin, "stores", None) is not None:
                self._pin.stores = stores
        stores.nbytes += nbytes
        cache.put(self._key, stores, stores.nbytes)
        return stores

    def _put_scoring(self, score: np.ndarray, a: int, b: int, x: np.ndarray) -> None:
        # Column j of the scoring store is (-2 x_j, |x_j|^2) for l2 and (-x_j, 0)
        # otherwise, so [q, 1] times it is the score of query q: one product.
        if self.metric == "l2":
            score[:-1, a:b] = -2 * x.T
            score[-1, a:b] = np.einsum("ij,ij->i", x, x)
        else:
            score[:-1, a:b] = -x.T
            score[-1, a:b] = 0

    def params(self) -> np.ndarray:
        if self._params is None:
            self._params = np.frombuffer(self.reader.section("vector.sq8_params"),
                                         dtype="<f4").reshape(2, self.dim)
        return self._params

    def fine_centroids(self) -> np.ndarray:
        if self._fine is None:
            self._fine = np.frombuffer(self.reader.section("vector.fine_centroids"),
                                       dtype="<f4").reshape(-1, self.dim)
        return self._fine

    def scoring_rows(self, start: int, stop: int) -> Tuple[np.ndarray, bool]:
        """A run's scoring columns (``[dim + 1, n]``: see :func:`scores`), and exact?

        The exact rows when the run has been reranked before, else its
        decoded SQ8 codes (one ranged read, the first time).
        """
        run = self._run_at[start]
        score, _, state = self._stores().arrays()
        if state[run] == SQ8_FETCHED:
            state[run] = SQ8_ONCE
        elif state[run] == SQ8_ONCE:
            state[run] = SQ8_AGAIN    # scored from codes twice: promote() loads its rows
        elif not state[run]:
            data = self.reader.section_range("vector.sq8", start * self.dim, stop * self.dim)
            dec = codes.sq8_decode(np.frombuffer(data, dtype=np.uint8).reshape(-1, self.dim),
                                   self.params())
            with self._lock:
                score, _, state = self._stores().arrays()
                if not state[run]:
                    score, _, state = self._room(dec.nbytes).arrays()
                    self._put_scoring(score, start, stop, dec)
                    state[run] = SQ8_ONCE
        return score[:, start:stop], bool(state[run] == EXACT)

    def load_codes(self, spans: Sequence[Tuple[int, int]]) -> None:
        """Reads the SQ8 codes of the cold runs among ``spans`` (``(start, stop)``) ahead
        of scoring them, in as few ranged reads as the layout allows.

        A cold query probes many runs of one superfile; read one by one, each is
        a round trip. Runs are stored in cell order, so the probed ones lie in a
        few stretches: runs closer than ``CODE_GAP_BYTES`` share one read, and the
        reads go out together.
        """
        state = self._stores().state
        cold = sorted({(int(a), int(b)) for a, b in spans
                       if b > a and a < self.rows and not state[self._run_at[a]]})
        if len(cold) < 2:
            return   # one run: scoring_rows reads it as before
        groups: List[List[Any]] = []
        for a, b in cold:
            if groups and (a - groups[-1][1]) * self.dim <= CODE_GAP_BYTES:
                groups[-1][1] = max(groups[-1][1], b)
                groups[-1][2].append((a, b))
            else:
                groups.append([a, b, [(a, b)]])
        params = self.params()

        def read(group) -> bytes:
            return self.reader.section_range("vector.sq8", group[0] * self.dim,
                                             group[1] * self.dim)

        datas = read_all(read, groups, self.reader.parallel)
        with self._lock:
            score, _, state = self._room(sum(b - a for a, b in cold) * self.dim * 4).arrays()
            for (start, _, runs), data in zip(groups, datas):
                codes_ = np.frombuffer(data, dtype=np.uint8).reshape(-1, self.dim)
                for a, b in runs:
                    run = self._run_at[a]
                    if state[run]:
                        continue    # another thread loaded it meanwhile
                    dec = codes.sq8_decode(codes_[a - start:b - start], params)
                    self._put_scoring(score, a, b, dec)
                    state[run] = SQ8_FETCHED

    def promote(self) -> None:
        """Loads the exact rows of the runs scored from codes more than once.

        A run a handle keeps probing is then scored exactly, with no rerank;
        a single cold query reads no more than it needs.
        """
        state = self._stores().state
        again = np.flatnonzero(state == SQ8_AGAIN)
        if len(again):
            self.exact_rows(self._starts[again], self.metric)

    def load_small(self, starts) -> None:
        """Loads the exact rows of a few runs not yet loaded, instead of their codes.

        A query that probes few cold runs reads their fp32 rows straight
        away: its candidates come from those runs, so codes first would mean
        a read for the codes and another for the rows of the same runs.
        """
        state = self._stores().state
        cold = [a for a in starts if a < self.rows and not state[self._run_at[a]]]
        if 0 < len(cold) <= EXACT_FIRST_RUNS:
            self.exact_rows(np.asarray(cold, dtype=np.int64), self.metric)

    def scoring_store(self) -> np.ndarray:
        """The scoring columns of every run (valid for the runs loaded)."""
        return self._stores().score

    def all_exact(self, starts: Sequence[int]) -> bool:
        """Whether every run starting at ``starts`` scores with exact rows."""
        state = self._stores().state
        return all(state[self._run_at[a]] == EXACT for a in starts)

    def decoded(self, start: int, stop: int) -> np.ndarray:
        """A run's scoring columns as rows, ``[n, dim + 1]`` (the 1-bit shortlist path)."""
        return self.scoring_rows(start, stop)[0].T

    def vectors(self, start: int, stop: int) -> np.ndarray:
        """Entries ``[start, stop)`` as (prepared) vectors, ``[n, dim]``: the
        exact rows when the run is loaded, else its decoded SQ8 codes."""
        cols = self.scoring_rows(start, stop)[0][:-1].T
        return cols * np.float32(-0.5 if self.metric == "l2" else -1.0)

    def exact_rows(self, rows: np.ndarray, metric: str) -> np.ndarray:
        """The fp32 vectors of ``rows`` (prepared for the metric), loading their runs.

        A run is read once, with the Parquet row groups that hold it; from
        then on it is also what the run is scored with.
        """
        runs = np.searchsorted(self._starts, rows, side="right") - 1
        _, exact, state = self._stores().arrays()
        if (state[runs] == EXACT).all():
            return exact[rows]
        with self._lock:
            need = np.unique(runs[self._stores().state[runs] != EXACT])
            # Whole row groups load (a read is a row group's column chunk), and
            # adjacent ones together; every run inside them becomes exact.
            groups = np.unique(np.searchsorted(self._rg_starts, self._starts[need], side="right") - 1)
            size = int((self._rg_starts[groups + 1] - self._rg_starts[groups]).sum()) \
                * self.dim * 8    # (exact rows and scoring columns)
            score, exact, state = self._room(size).arrays()
            need = np.unique(runs[state[runs] != EXACT])   # (another thread may have loaded some)
            if not len(need):
                return exact[rows]
            groups = np.unique(np.searchsorted(self._rg_starts, self._starts[need], side="right") - 1)
            spans = [(int(self._rg_starts[s[0]]), int(self._rg_starts[s[-1] + 1]))
                     for s in np.split(groups, np.flatnonzero(np.diff(groups) != 1) + 1)]

            def take(span: Tuple[int, int]):
                return self.reader.take(np.arange(*span), columns=[self.column])

            for (a, b), table in zip(spans, read_all(take, spans, self.reader.parallel)):
                x = prepare(vectors_of(table, self.column, self.dim), metric)
                exact[a:b] = x
                self._put_scoring(score, a, b, x)
                inside = np.arange(np.searchsorted(self._starts, a),
                                   np.searchsorted(self._starts, b))
                state[inside[self._starts[inside] < self.rows]] = EXACT
            return exact[rows]

    def bits(self, start: int, stop: int) -> np.ndarray:
        data = self.reader.section_range("vector.bits", start * self.nbytes, stop * self.nbytes)
        return np.frombuffer(data, dtype=np.uint8).reshape(-1, self.nbytes)

    def to_rows(self, entries: np.ndarray) -> np.ndarray:
        if len(entries) == 0 or entries.max() < self.rows:
            return entries
        if self._replica_rows is None:
            self._replica_rows = np.frombuffer(
                self.reader.section("vector.replica_rows"), dtype="<i4").astype(np.int64)
        out = entries.copy()
        rep = entries >= self.rows
        out[rep] = self._replica_rows[entries[rep] - self.rows]
        return out
