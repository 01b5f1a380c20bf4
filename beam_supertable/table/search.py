"""Search over a table version: vector, text and hybrid, pruned by filters."""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import SchemaMismatchError, SupertableError
from beam_supertable.format.filters import mask, pruned
from beam_supertable.format.schema import ID, TOO_LARGE, overflowing_row
from beam_supertable.fts import search as text_search
from beam_supertable.fts.analysis import Analyzer, analyzer_of
from beam_supertable.vector import calibrate
from beam_supertable.vector import dense as dense_mod
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector import search as vector_search
from beam_supertable.vector.dense import DenseIndex
from beam_supertable.vector.metric import nearest, prepare


class Searcher:
    """``Supertable.search`` and the machinery behind it, for one table handle.

    Reads the handle's snapshot, readers and byte cache; keeps what it derives
    from them (the probe law, the dense index, the cells of each superfile,
    the result schema) for the handle's next search. Knows nothing of how
    the table is written.
    """

    def __init__(self, table: Any) -> None:   # the Supertable it serves
        # Weak: a handle and its caches go as soon as the handle is dropped.
        self.table = weakref.proxy(table)
        self._lineage: Dict[tuple, Optional[np.ndarray]] = {}
        self._law_cache: tuple = (None, None)
        self._dense_memo: tuple = (None, None, None, None, None)
        self._result_schema: tuple = (None, None, None)
        self._entry_cells: Dict[str, frozenset] = {}
        self._grid_fits: tuple = (None, None)

    # -- search ------------------------------------------------------------
    def search(self, vector=None, text: Optional[str] = None, k: int = 10,
               nprobe: Optional[int] = None, filter: Optional[pc.Expression] = None,  # noqa: A002
               columns: Optional[Sequence[str]] = None, *,
               recall_target: Optional[float] = None) -> pa.Table:
        """The rows ``Supertable.search`` returns (see its docstring)."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"{self.table.uri}: k must be a positive int, got {k!r}")
        if vector is None and text is None:
            raise ValueError(f"{self.table.uri}: search needs vector=..., text=... or both")
        vector_search.check_probe_args(self.table.uri, nprobe, recall_target)
        names = list(self.table.user_schema.names if columns is None else columns)
        unknown = [c for c in names if c not in self.table.user_schema.names]
        if unknown:
            raise SchemaMismatchError(f"{self.table.uri}: unknown column(s) {unknown}")
        twice = sorted({c for c in names if names.count(c) > 1})
        if twice:
            raise ValueError(f"{self.table.uri}: column(s) {twice} asked for more than once")
        queries = None
        if vector is not None:
            vp = self.table._vector_props()
            if vp is None:
                raise SupertableError(f"{self.table.uri}: the table has no vector column to search")
            queries, single = _queries(self.table.uri, vector, vp["dim"], vp["metric"])
        else:
            single = True
        if text is not None:
            if self.table._fts_props() is None:
                raise SupertableError(f"{self.table.uri}: the table has no text columns to search")
            if not isinstance(text, str):
                raise TypeError(f"{self.table.uri}: text must be a string, got {type(text).__name__}")
        entries = pruned(self.table.superfiles(), filter, self.table.schema)
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
        fp = self.table._fts_props()
        txt = text_search.text_candidates(
            entries, self.table.superfiles(), text, depth, fp["columns"],
            self._analyzer(), self.table._reader, self.table._bloom, allowed,
            self.table._deleted_text)
        if vec is None:
            # Text only: one query, its best k as they are ranked.
            top = txt[:k]
            return self._materialize(
                entries, None, np.fromiter((si for _, si, _ in top), np.int64, len(top)),
                np.fromiter((row for _, _, row in top), np.int64, len(top)), names, single,
                score=np.fromiter((s for s, _, _ in top), np.float64, len(top)))
        flat = []
        for qi in range(len(queries)):
            n = int((vec[2][qi] >= 0).sum())
            mine = list(zip(vec[0][qi, :n].tolist(), vec[1][qi, :n].tolist(),
                            vec[2][qi, :n].tolist()))
            dist = {(si, row): d for d, si, row in mine}
            fused = text_search.rrf([[(si, row) for _, si, row in mine],
                                     [(si, row) for _, si, row in txt]], k)
            flat.extend((qi, si, row, dist.get((si, row)), s) for s, (si, row) in fused)
        qi, sis, rows, dist, score = (list(c) for c in zip(*flat)) if flat else ([],) * 5
        return self._materialize(
            entries, np.array(qi, np.int64), np.array(sis, np.int64), np.array(rows, np.int64),
            names, single, dist=dist, score=score)

    def _analyzer(self) -> Analyzer:
        """The table's text analysis, the one its superfiles' text indexes were built with."""
        return analyzer_of(self.table._fts_props())

    def _allowed(self, entries, filter):  # noqa: A002
        """None when every row passes; else ``allowed(superfile, rows) -> mask``."""
        if filter is None and not any(self.table._snapshot.deletes.get(e["id"]) for e in entries):
            return None

        def allowed(si: int, rows: np.ndarray) -> np.ndarray:
            e = entries[si]
            ok = ~np.isin(rows, self.table._deleted_rows(e))
            if filter is not None and ok.any():
                ok &= mask(self.table._reader(e).take(rows), filter)
            return ok

        return allowed

    def _vector_hits(self, queries, depth, nprobe, entries, allowed, recall_target=None,
                     filtered=False):
        """Each query's ``depth`` nearest rows: ``[Q, depth]`` distances (inf pads),
        superfiles (indexes into ``entries``) and rows (-1 pads), nearest first."""
        vp = self.table._vector_props()
        centroids = self.table.grid()
        n_q = len(queries)
        if centroids is None or not entries:
            return (np.full((n_q, depth), np.inf, np.float32), np.full((n_q, depth), -1, np.int64),
                    np.full((n_q, depth), -1, np.int64))
        metric = vp["metric"]
        q = prepare(queries, metric)
        sha = self.table._snapshot.properties["grid"]["sha256"]
        if metric != "cosine":
            # Writes refuse vectors whose distances overflow float32 (they would
            # rank nothing, silently); a table written before may hold them, and
            # its grid, trained by squared distances, shows it.
            if self._grid_fits[0] != sha:
                self._grid_fits = (sha, overflowing_row(centroids) is None)
            if not self._grid_fits[1]:
                raise ValueError(
                    f"{self.table.uri}: the table's vectors are too large for {metric} distances "
                    f"in float32 (their squared norms overflow); rewrite them scaled down")
        n_cells = len(centroids)
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
        if len(self._entry_cells) > 2 * self.table._snapshot.totals.get("superfiles", 0) + 1024:
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
                indexes = [self.table._reader(entries[si]).vector_index() for si in live]
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
        vp = self.table._vector_props()
        # The key is the same for every search of a version: kept, tagged with
        # the snapshot and the entries it was made from (their first and last
        # objects, held so their ids stay theirs: a refresh racing this search
        # must not keep another version's).
        memo = self._dense_memo
        if memo[0] is not self.table._snapshot or memo[1] != (len(entries), id(entries[0]),
                                                        id(entries[-1])):
            mine = [(si, e) for si, e in enumerate(entries) if e.get("cells")]
            rows = sum(int(e.get("rows", 0)) for _, e in mine)
            key = None if not mine or not dense_mod.usable(rows, vp["dim"]) else (
                "dense", sha, vp["metric"],
                tuple((e["id"], tuple(self.table._snapshot.deletes.get(e["id"], ()))) for _, e in mine))
            memo = self._dense_memo = (self.table._snapshot, (len(entries), id(entries[0]),
                                                        id(entries[-1])), mine, key, entries)
        mine, key = memo[2], memo[3]
        if key is None:
            return None
        found = self.table._cache.get(key)
        if found is not None or not batch:
            return found
        built = dense_mod.DenseIndex.build(
            [self.table._reader(e) for _, e in mine], [self.table._deleted_rows(e) for _, e in mine],
            len(self.table.grid()), vp["metric"])
        # Its superfile numbers are positions in ``mine``: make them entries'.
        built.superfile = np.append(np.array([si for si, _ in mine], np.int64), -1)[built.superfile]
        return self.table._cache.put(key, built, built.nbytes)

    def _cells_of(self, entry: dict) -> frozenset:
        cells = self._entry_cells.get(entry["id"])
        if cells is None:
            cells = self._entry_cells[entry["id"]] = frozenset(
                entry.get("cells", ())) | frozenset(entry.get("replica_cells", ()))
        return cells

    def _probe_law(self) -> Optional[calibrate.ProbeLaw]:
        """This version's probe law (parsed once per version)."""
        doc = self.table._snapshot.properties.get(calibrate.LAW_PROPERTY)
        if self._law_cache[0] is not doc:
            self._law_cache = (doc, calibrate.ProbeLaw.from_json(doc))
        return self._law_cache[1]

    def _by_grid(self, entries) -> List[tuple]:
        """Entries grouped by the grid version they were written against:
        ``[(ancestor map or None for the current grid, [entry index, ...])]``."""
        stamp = self.table._snapshot.properties["grid"]
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
        if memo[0] is not self.table._snapshot or memo[1] != shape:
            fields = [self.table.schema.field(ID)] + [self.table.schema.field(c) for c in names]
            if dist is not None:
                fields.append(pa.field("_distance", pa.float32()))
            if score is not None:
                fields.append(pa.field("_score", pa.float32()))
            if not single:
                fields.append(pa.field("_query", pa.int32()))
            memo = self._result_schema = (self.table._snapshot, shape, pa.schema(fields))
        schema = memo[2]
        if not len(rows):
            return schema.empty_table()
        if not names:
            # Ids only: each hit's id straight from its superfile's ``_id`` column.
            if len(entries) == 1:   # (one superfile: every hit is in it)
                ids = self.table._reader(entries[0]).ids_of(rows)
            else:
                ids = np.empty(len(rows), dtype=np.int64)
                for si in np.flatnonzero(np.bincount(sis, minlength=len(entries))).tolist():
                    mask = sis == si
                    ids[mask] = self.table._reader(entries[si]).ids_of(rows[mask])
            columns = [pa.array(ids, schema.field(0).type)]
            if dist is not None:
                columns.append(_float32(dist))
            if score is not None:
                columns.append(_float32(score))
            if not single:
                columns.append(pa.array(np.asarray(qi).astype(np.int32, copy=False), pa.int32()))
            return pa.Table.from_arrays(columns, schema=schema)
        # Each superfile's hits in one take (repeats and order as asked);
        # several superfiles are put back in hit order by one more take.
        groups = np.flatnonzero(np.bincount(sis, minlength=len(entries))).tolist()
        cols = [ID] + list(names)
        if len(groups) == 1:
            table = self.table._reader(entries[groups[0]]).take_kept(rows, cols)
        else:
            parts, where, base = [], np.empty(len(rows), dtype=np.int64), 0
            for si in groups:
                mask = sis == si
                parts.append(self.table._reader(entries[si]).take_kept(rows[mask], cols))
                where[mask] = base + np.arange(len(parts[-1]))
                base += len(parts[-1])
            table = pa.concat_tables(parts).take(pa.array(where))
        if dist is not None:
            table = table.append_column("_distance", _float32(dist))
        if score is not None:
            table = table.append_column("_score", _float32(score))
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


def _queries(uri: str, vector, dim: int, metric: str) -> Tuple[np.ndarray, bool]:
    """The query vector(s), checked, as a ``[Q, dim]`` matrix (``prepare`` makes
    them float32: float64 ones stay so, so a cosine query past float32's range
    keeps its direction), and whether one was given."""
    wide = np.asarray(vector)
    wide = wide if wide.dtype == np.float32 else wide.astype(np.float64)
    single = wide.ndim == 1
    wide = wide[None, :] if single else wide
    if wide.ndim != 2 or wide.shape[1] != dim:
        raise ValueError(f"{uri}: query vector(s) must have {dim} values, got shape "
                         f"{np.asarray(vector).shape}")
    if not np.isfinite(wide).all():
        raise ValueError(f"{uri}: query vector holds NaN or infinity")
    if metric != "cosine":
        row = overflowing_row(wide)
        if row is not None:
            raise ValueError(f"{uri}: query vector {row} {TOO_LARGE}")
    return wide, single


def _float32(values) -> pa.Array:
    """A float32 column of ``values`` (None for a missing one): numpy's cast, then
    Arrow's zero-copy wrap, is a third of the time of Arrow casting while it converts."""
    if isinstance(values, np.ndarray):
        return pa.array(values.astype(np.float32, copy=False))
    return pa.array(values, pa.float32())
