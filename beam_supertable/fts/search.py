"""Text search (BM25 over superfiles) and reciprocal-rank fusion for hybrid search."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from beam_supertable.fts import index as fts_index
from beam_supertable.fts.analysis import as_analyzer
from beam_supertable.fts.tokenize import contains_phrase


class TextSource(Protocol):
    """What text search reads a superfile through (``reader.SuperfileReader`` is one)."""

    def text_index(self) -> fts_index.TextIndex: ...

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> Any: ...

RRF_K = 60
CHECK_BATCH_MIN = 64   # rows checked (phrases, filter) at a time at first, per superfile
DENSE_SHARE = 8        # postings above 1/8 of a superfile's rows: scores in a dense array


def rrf(rankings: Sequence[Sequence[Tuple[int, int]]], k: int) -> List[Tuple[float, Tuple[int, int]]]:
    """Reciprocal-rank fusion of ranked (superfile, row) lists."""
    scores: Dict[Tuple[int, int], float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(((s, key) for key, s in scores.items()), key=lambda t: (-t[0], t[1]))[:k]


def text_candidates(entries: Sequence[dict], collection: Sequence[dict], query: str, k: int,
                    fts_columns: Sequence[str], analysis,
                    reader_of: Callable[[dict], TextSource],
                    bloom_of: Callable[[dict], bytes],
                    allowed: Optional[Callable[[int, np.ndarray], np.ndarray]] = None,
                    deleted_of: Optional[Callable[[dict], Tuple[np.ndarray, int]]] = None,
                    ) -> List[Tuple[float, int, int]]:
    """BM25 top ``k`` as (score, superfile, row), best first; superfile indexes ``entries``.

    Args:
        entries: the superfiles to search (those a filter left).
        collection: every superfile of the version. BM25's collection
            statistics (rows, average length, each term's document
            frequency) sum over their live rows, so a row's score does not
            depend on how the rows were split into superfiles, on what a
            filter or the bloom filters skip, or on whether deleted rows
            are still in the superfiles (before ``optimize``) or gone.
        analysis: the table's analyzer (``fts.analysis.analyzer_of``), or
            the stop words of the plain tokenizer.
        reader_of: opens a superfile (only those that may hold a term).
        bloom_of: a superfile's decoded term bloom filter.
        allowed: ``allowed(superfile, rows) -> mask`` of rows that may be
            returned (filter and deletes), or None for all.
        deleted_of: a superfile's deleted rows (sorted, unique) and their
            total token length (see :func:`deleted_length`); None when no
            row is deleted anywhere. Their share of the statistics is taken
            off: rows, length, and from each query term's postings.
    """
    analyzer = as_analyzer(analysis)
    terms, required, phrases = analyzer.parse_query(query)
    if not terms or not entries:
        return []
    n_docs = sum(e["text"]["rows"] for e in collection)
    total = sum(e["text"]["total_length"] for e in collection)
    df = {t: 0 for t in terms}
    probed: Dict[str, List[str]] = {}   # superfile id: the terms its bloom filter may hold
    for e in collection:
        gone, gone_length = deleted_of(e) if deleted_of is not None else (None, 0)
        if gone is not None:
            n_docs -= len(gone)
            total -= gone_length
        bits = bloom_of(e)
        present = probed[e["id"]] = [t for t in terms if fts_index.bloom_may_contain(bits, t)]
        if present:
            ix = reader_of(e).text_index()
            for t in present:
                df[t] += ix.doc_freq(t) if gone is None or not len(gone) else \
                    _live_doc_freq(ix, t, gone)
    avg = total / n_docs if n_docs else 0.0
    # Score only superfiles that may hold every required term and some term.
    must = set(required) | {w for p in phrases for w in p}
    results: List[Tuple[float, int, int]] = []
    for si, e in enumerate(entries):
        present = probed.get(e["id"])
        if present is None:
            bits = bloom_of(e)
            present = [t for t in terms if fts_index.bloom_may_contain(bits, t)]
        if not present or not must.issubset(present):
            continue
        reader = reader_of(e)

        def keep(rows: np.ndarray, si=si, reader=reader) -> np.ndarray:
            ok = np.ones(len(rows), dtype=bool)
            if phrases:
                texts = fts_index.row_texts(reader.take(rows, columns=list(fts_columns)),
                                            fts_columns)
                ok = np.array([all(contains_phrase(toks, ph) for ph in phrases)
                               for toks in analyzer.tokenize_many(texts.to_pylist())],
                              dtype=bool)
            if allowed is not None and ok.any():
                ok[ok] = allowed(si, rows[ok])
            return ok

        check = keep if (phrases or allowed is not None) else None
        for score, row in _superfile_top(reader.text_index(), terms, must, df, n_docs, avg, k,
                                         check):
            results.append((score, si, row))
    results.sort(key=lambda t: (-t[0], t[1], t[2]))
    return results[:k]


def deleted_length(ix, gone: np.ndarray) -> int:
    """The total token length of a superfile's deleted rows ``gone``."""
    return int(ix.lengths[gone].sum()) if len(gone) else 0


def _live_doc_freq(ix, term: str, gone: np.ndarray) -> int:
    """``term``'s document frequency in a superfile, its deleted rows left out."""
    p = ix.postings(term)
    if p is None:
        return 0
    rows = p[0]
    # Both sorted: count the postings rows that are deleted by binary search.
    at = np.searchsorted(gone, rows)
    hit = (at < len(gone)) & (gone[np.minimum(at, len(gone) - 1)] == rows)
    return int(len(rows) - hit.sum())


def _superfile_top(ix, terms: Sequence[str], must, df: Dict[str, int], n_docs: int,
                   avg: float, k: int, check: Optional[Callable[[np.ndarray], np.ndarray]]
                   ) -> List[Tuple[float, int]]:
    """One superfile's best ``k`` (score, row), best first (ties by row).

    Rows are ranked by score and checked (phrases, filter) a growing batch at
    a time, so only about ``k`` rows are kept and only the best are read.
    """
    found = [(t, ix.postings(t)) for t in terms]
    found = [(t, p) for t, p in found if p is not None]
    if not found or any(ix.postings(t) is None for t in must):
        return []
    rows, scores = _scored(ix, found, must, df, n_docs, avg)
    if check is None and len(rows) > k:
        # The k best without sorting every hit: all rows scoring at least the
        # k-th best score (ties included), then an exact sort of those.
        kth = np.partition(-scores, k - 1)[k - 1]
        best = -scores <= kth
        rows, scores = rows[best], scores[best]
    at = np.lexsort((rows, -scores))
    order, scores = rows[at], scores[at]
    if check is None:
        return list(zip(scores[:k].tolist(), order[:k].tolist()))
    kept: List[int] = []
    pos, step = 0, max(k, CHECK_BATCH_MIN)
    while pos < len(order) and len(kept) < k:
        batch = order[pos:pos + step]
        kept.extend((pos + np.flatnonzero(check(batch))).tolist())
        pos += len(batch)
        step *= 2
    return [(float(scores[i]), int(order[i])) for i in kept[:k]]


def _scored(ix, found, must, df: Dict[str, int], n_docs: int, avg: float
            ) -> Tuple[np.ndarray, np.ndarray]:
    """The rows holding a query term and every ``must`` term (ascending), and their scores.

    A row's score adds its terms' BM25 in query-term order, starting from 0,
    whichever way it is summed: a dense array over every row when the postings
    cover much of the superfile, else the postings alone (a query of rare
    words then costs what its postings cost, not what the superfile's rows do).
    """
    posted = [p[0] for _, p in found]
    flat = np.concatenate(posted) if len(posted) > 1 else posted[0]
    idf = np.repeat([fts_index.bm25_idf(df[t], n_docs) for t, _ in found],
                    [len(r) for r in posted])
    tf64 = ix.tf_float()
    spans = [ix.span(t) for t, _ in found]
    tf = np.concatenate([tf64[s:e] for s, e in spans]) if len(spans) > 1 else \
        tf64[spans[0][0]:spans[0][1]]
    each = fts_index.bm25_postings(tf, ix.length_norm(avg)[flat], idf)
    needed = [i for i, (t, _) in enumerate(found) if t in must]
    if len(flat) * DENSE_SHARE > len(ix.lengths):
        scores = np.zeros(len(ix.lengths), dtype=np.float64)
        hits = np.zeros(len(ix.lengths), dtype=np.int32)
        at = 0
        for i, r in enumerate(posted):
            scores[r] += each[at:at + len(r)]
            if not needed or i in needed:
                hits[r] += 1
            at += len(r)
        rows = np.flatnonzero(hits >= max(1, len(needed)))
        return rows, scores[rows]
    if len(posted) == 1:
        return flat, each + 0.0   # (0 + score, as the dense sum)
    rows, inverse = np.unique(flat, return_inverse=True)
    # bincount adds each row's weights in input order: the dense sum's order.
    scores = np.bincount(inverse, weights=each, minlength=len(rows))
    if needed:
        mark = np.repeat(np.isin(np.arange(len(found)), needed), [len(r) for r in posted])
        keep = np.bincount(inverse, weights=mark, minlength=len(rows)) == len(needed)
        rows, scores = rows[keep], scores[keep]
    return rows, scores
