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

    The query's postings are scored and the best ``k`` kept in one compiled pass
    (:func:`kernels.score_top`). With a check (phrases, filter), every matching
    row is ranked by score and checked a growing batch at a time, so only about
    ``k`` rows are kept and only the best are read.
    """
    # numba is imported by the first text search, not by every process importing the package.
    from beam_supertable.fts import kernels
    lookup = ix._lookup
    present = [t for t in terms if t in lookup]
    if not present or any(t not in lookup for t in must):
        return []
    rows, scores = kernels.index_top(
        ix, np.array([lookup[t] for t in present], dtype=np.int64),
        np.array([fts_index.bm25_idf(df[t], n_docs) for t in present], dtype=np.float64),
        np.array([t in must for t in present], dtype=np.int8), ix.length_norm(avg),
        k if check is None else -1)
    if check is None:
        return list(zip(scores.tolist(), rows.tolist()))
    at = np.lexsort((rows, -scores))
    order, scores = rows[at], scores[at]
    kept: List[int] = []
    pos, step = 0, max(k, CHECK_BATCH_MIN)
    while pos < len(order) and len(kept) < k:
        batch = order[pos:pos + step]
        kept.extend((pos + np.flatnonzero(check(batch))).tolist())
        pos += len(batch)
        step *= 2
    return [(float(scores[i]), int(order[i])) for i in kept[:k]]
