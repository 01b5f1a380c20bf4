"""Text search (BM25 over superfiles) and reciprocal-rank fusion for hybrid search."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from beam_supertable.fts import index as fts_index
from beam_supertable.fts.tokenize import contains_phrase, parse_query, tokenize_many
from beam_supertable.reader import SuperfileReader

RRF_K = 60


def rrf(rankings: Sequence[Sequence[Tuple[int, int]]], k: int) -> List[Tuple[float, Tuple[int, int]]]:
    """Reciprocal-rank fusion of ranked (superfile, row) lists."""
    scores: Dict[Tuple[int, int], float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(((s, key) for key, s in scores.items()), key=lambda t: (-t[0], t[1]))[:k]


def text_candidates(readers: Sequence[SuperfileReader], entries: Sequence[dict], query: str,
                    k: int, fts_columns: Sequence[str], stop_words,
                    allowed: Optional[Callable[[int, np.ndarray], np.ndarray]],
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
            ok = np.array([all(contains_phrase(toks, ph) for ph in phrases)
                           for toks in tokenize_many(texts.to_pylist(), stop_words)], dtype=bool)
            rows = rows[ok]
        if len(rows) and allowed is not None:
            rows = rows[allowed(si, rows)]
        results.extend((float(scores[r]), si, int(r)) for r in rows)
    results.sort(key=lambda t: (-t[0], t[1], t[2]))
    return results[:k]
