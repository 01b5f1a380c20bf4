"""Vector, text and hybrid search over one table version."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.fts import index as fts_index
from beam_supertable.fts.tokenize import contains_phrase, parse_query, tokenize
from beam_supertable.reader import SuperfileReader
from beam_supertable.vector import codes
from beam_supertable.vector.metric import distances, nearest, prepare

DEFAULT_NPROBE_SHARE = 0.08     # of the cells; keeps recall@10 >= 0.95 on clustered data
RERANK_PER_K = 8                 # SQ8 candidates reranked exactly, per requested k
SHORTLIST_MIN_ENTRIES = 4096     # a cell larger than this is shortlisted by 1-bit codes first
SHORTLIST_SHARE = 0.25
FINE_PROBE_SHARE = 0.5
RRF_K = 60


def default_nprobe(n_cells: int) -> int:
    return max(1, min(n_cells, math.ceil(DEFAULT_NPROBE_SHARE * n_cells)))


# Candidates are (distance, superfile index, row) triples per query.
Candidates = List[Tuple[float, int, int]]


def _cell_entries(reader: SuperfileReader, q: np.ndarray, cell: int, metric: str,
                  fine_cache: dict) -> List[Tuple[int, int, int]]:
    """Index-entry runs ``(start, stop, fine)`` of one cell to score for one query."""
    vec = reader.header["vector"]
    dim = vec["dim"]
    spans = []
    for c, fine_counts in zip(vec["cells"], vec["fine_counts"]):
        if c[0] != cell:
            continue
        _, start, count, fine_start, n_fine = c
        if n_fine == 1:
            spans.append((start, start + count, fine_start))
            continue
        cent = _fine_centroids(reader, fine_start, n_fine, dim, fine_cache)
        probe = max(1, math.ceil(n_fine * FINE_PROBE_SHARE))
        offs = np.concatenate([[0], np.cumsum(fine_counts)])
        for j in nearest(q[None, :], cent, metric, probe)[0]:
            spans.append((start + int(offs[j]), start + int(offs[j + 1]), fine_start + int(j)))
    n_rows = reader.header["rows"]
    for r in vec["replicas"]:
        if r[0] == cell:
            spans.append((n_rows + r[1], n_rows + r[1] + r[2], r[3]))
    return spans


def _fine_centroids(reader, start, count, dim, cache):
    key = (id(reader), start, count)
    if key not in cache:
        data = reader.section_range("vector.fine_centroids", start * dim * 4, (start + count) * dim * 4)
        cache[key] = np.frombuffer(data, dtype="<f4").reshape(count, dim)
    return cache[key]


class _CodeCache:
    """SQ8 codes, 1-bit codes and replica maps of one superfile, by entry range."""

    def __init__(self, reader: SuperfileReader) -> None:
        self.reader = reader
        vec = reader.header["vector"]
        self.dim = vec["dim"]
        self.nbytes = (self.dim + 7) // 8
        self.params = np.frombuffer(reader.section("vector.sq8_params"), dtype="<f4").reshape(2, self.dim)
        self._sq8: Dict[Tuple[int, int], np.ndarray] = {}
        self._bits: Dict[Tuple[int, int], np.ndarray] = {}
        self._replica_rows = None

    def sq8(self, span):
        if span not in self._sq8:
            data = self.reader.section_range("vector.sq8", span[0] * self.dim, span[1] * self.dim)
            self._sq8[span] = codes.sq8_decode(
                np.frombuffer(data, dtype=np.uint8).reshape(-1, self.dim), self.params)
        return self._sq8[span]

    def bits(self, span):
        if span not in self._bits:
            data = self.reader.section_range("vector.bits", span[0] * self.nbytes, span[1] * self.nbytes)
            self._bits[span] = np.frombuffer(data, dtype=np.uint8).reshape(-1, self.nbytes)
        return self._bits[span]

    def rows(self, entries: np.ndarray) -> np.ndarray:
        n = self.reader.header["rows"]
        if (entries < n).all():
            return entries
        if self._replica_rows is None:
            self._replica_rows = np.frombuffer(self.reader.section("vector.replica_rows"), dtype="<i4")
        out = entries.copy()
        rep = entries >= n
        out[rep] = self._replica_rows[entries[rep] - n]
        return out


def vector_candidates(readers: Sequence[SuperfileReader], cells_of: Sequence[set],
                      queries: np.ndarray, probes: np.ndarray, metric: str, k: int,
                      allowed: Callable[[int, np.ndarray], np.ndarray]) -> List[Candidates]:
    """Per query, the best ``k`` exact candidates across superfiles.

    ``allowed(superfile, rows)`` returns the mask of rows that pass the filter
    and are not deleted.
    """
    per_query: List[Candidates] = [[] for _ in range(len(queries))]
    fine_cache: dict = {}

    def one(si):
        reader = readers[si]
        cache = _CodeCache(reader)
        found = []
        for qi, q in enumerate(queries):
            cells = [c for c in probes[qi] if c in cells_of[si]]
            if not cells:
                continue
            entry_ids, approx = [], []
            for cell in cells:
                for span in _cell_entries(reader, q, int(cell), metric, fine_cache):
                    if span[1] <= span[0]:
                        continue
                    ids = np.arange(span[0], span[1])
                    if span[1] - span[0] > SHORTLIST_MIN_ENTRIES:
                        ids, dec = _shortlist(cache, span, q, ids, fine_cache)
                    else:
                        dec = cache.sq8(span[:2])
                    entry_ids.append(ids)
                    approx.append(distances(q[None, :], dec, metric)[0])
            if not entry_ids:
                continue
            ids = np.concatenate(entry_ids)
            d = np.concatenate(approx)
            rows = cache.rows(ids)
            rows, first = np.unique(rows, return_index=True)
            d = d[first]
            mask = allowed(si, rows)
            rows, d = rows[mask], d[mask]
            if len(rows) == 0:
                continue
            keep = min(len(rows), k * RERANK_PER_K)
            top = np.argpartition(d, keep - 1)[:keep] if keep < len(rows) else np.arange(len(rows))
            found.append((qi, rows[top]))
        if not found:
            return []
        # Exact rerank from the fp32 vectors in the Parquet data, one read.
        need = np.unique(np.concatenate([r for _, r in found]))
        column = reader.header["vector"].get("column")
        table = reader.take(need, columns=[column])
        exact_x = prepare(np.asarray(table.column(column).combine_chunks().flatten()
                                     .to_numpy(zero_copy_only=False), dtype=np.float32)
                          .reshape(len(need), -1), metric)
        out = []
        for qi, rows in found:
            pos = np.searchsorted(need, rows)
            d = distances(queries[qi][None, :], exact_x[pos], metric)[0]
            best = np.argsort(d, kind="stable")[:k]
            out.extend((qi, float(d[b]), si, int(rows[b])) for b in best)
        return out

    workers = min(8, max(1, len(readers)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(one, range(len(readers))):
            for qi, d, si, row in result:
                per_query[qi].append((d, si, row))
    return [sorted(c)[:k] for c in per_query]


def _shortlist(cache: _CodeCache, span, q, ids, fine_cache):
    """1-bit shortlist of a large run; SQ8 scores only the survivors."""
    start, stop, fine = span
    center = _fine_centroids(cache.reader, fine, 1, cache.dim, fine_cache)[0]
    qbits = codes.bits_encode((q - center)[None, :])[0]
    ham = codes.hamming(qbits, cache.bits((start, stop)))
    keep = max(1, int(len(ids) * SHORTLIST_SHARE))
    pick = np.sort(np.argpartition(ham, keep - 1)[:keep])
    return ids[pick], cache.sq8((start, stop))[pick]


def rrf(rankings: Sequence[Sequence[Tuple[int, int]]], k: int) -> List[Tuple[float, Tuple[int, int]]]:
    """Reciprocal-rank fusion of ranked (superfile, row) lists."""
    scores: Dict[Tuple[int, int], float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(((s, key) for key, s in scores.items()), key=lambda t: (-t[0], t[1]))[:k]


def text_candidates(readers: Sequence[SuperfileReader], entries: Sequence[dict], query: str,
                    k: int, fts_columns: Sequence[str], stop_words,
                    allowed: Callable[[int, np.ndarray], np.ndarray],
                    bloom_cache: dict) -> List[Tuple[float, int, int]]:
    """BM25 top ``k`` as (score, superfile, row), best first."""
    terms, required, phrases = parse_query(query, stop_words)
    if not terms:
        return []
    n_docs = sum(e["text"]["rows"] for e in entries)
    total = sum(e["text"]["total_length"] for e in entries)
    avg = total / n_docs if n_docs else 0.0
    # Superfiles that may hold every required term and at least one term.
    must = set(required) | {w for p in phrases for w in p}
    candidates = []
    for si, e in enumerate(entries):
        bloom = e["text"]["bloom"]
        if any(not fts_index.bloom_may_contain(bloom, t, bloom_cache) for t in must):
            continue
        if not any(fts_index.bloom_may_contain(bloom, t, bloom_cache) for t in terms):
            continue
        candidates.append(si)
    indexes = {si: readers[si].text_index() for si in candidates}
    df = {t: sum(ix.doc_freq(t) for ix in indexes.values()) for t in terms}
    results = []
    for si, ix in indexes.items():
        scores = np.zeros(len(ix.lengths), dtype=np.float64)
        hits = np.zeros(len(ix.lengths), dtype=bool)
        for t in terms:
            p = ix.postings(t)
            if p is None:
                continue
            rows, tf = p
            scores[rows] += fts_index.bm25(tf.astype(np.float64), ix.lengths[rows], df[t], n_docs, avg)
            hits[rows] = True
        for t in must:
            p = ix.postings(t)
            present = np.zeros(len(ix.lengths), dtype=bool)
            if p is not None:
                present[p[0]] = True
            hits &= present
        rows = np.where(hits)[0]
        if len(rows) and phrases:
            texts = fts_index.row_texts(readers[si].take(rows, columns=list(fts_columns)), fts_columns)
            ok = np.array([all(contains_phrase(tokenize(tx, stop_words), ph) for ph in phrases)
                           for tx in texts], dtype=bool)
            rows = rows[ok]
        if len(rows):
            rows = rows[allowed(si, rows)]
        results.extend((float(scores[r]), si, int(r)) for r in rows)
    results.sort(key=lambda t: (-t[0], t[1], t[2]))
    return results[:k]
