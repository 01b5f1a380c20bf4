"""A superfile's inverted index, as an Arrow IPC stream (data only).

The stream holds one record batch per table, in this order:

1. ``terms``: ``term`` (utf8, sorted), ``df`` (int32), ``start`` (int64) —
   postings of term i are rows ``start[i] .. start[i+1]`` of the next batch;
2. ``postings``: ``row`` (int32, the row in the superfile), ``tf`` (int32);
3. ``lengths``: ``length`` (int32), the token count of each row.

The manifest entry keeps the summary (rows, total length, a term bloom
filter) so that BM25's collection statistics and superfile skipping need no
superfile reads.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.fts.analysis import Analyzer, as_analyzer

BLOOM_BITS_PER_TERM = 10
BLOOM_HASHES = 7
BLOOM_MAX_BYTES = 1 << 20
TERM_OVERHEAD_BYTES = 160   # a loaded term: its str object and its slot in the lookup dict


def row_texts(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    """One text per row: the FTS columns joined by a space (a null counts as empty)."""
    cols = [pc.fill_null(table.column(c).combine_chunks().cast(pa.string()), "") for c in columns]
    if len(cols) == 1:
        return cols[0]
    return pc.binary_join_element_wise(*cols, " ")


def build(texts, analysis: Union[Analyzer, FrozenSet[str]] = frozenset()) -> Tuple[bytes, Dict]:
    """Index bytes and the manifest summary for one superfile's rows (vectorized).

    ``analysis``: the table's :class:`Analyzer` (or, as before analysis, the
    stop words of the plain tokenizer).
    """
    flat, rows = as_analyzer(analysis).tokenize_column(texts)
    n = len(texts)
    lengths = np.bincount(rows, minlength=n).astype(np.int32)
    pairs = pa.table({"term": flat, "row": pa.array(rows.astype(np.int32))})
    counted = pairs.group_by(["term", "row"]).aggregate([([], "count_all")])
    counted = counted.sort_by([("term", "ascending"), ("row", "ascending")])
    encoded = counted["term"].combine_chunks().dictionary_encode()
    terms = encoded.dictionary  # first-appearance order of a sorted column: sorted
    df = np.bincount(encoded.indices.to_numpy(), minlength=len(terms)).astype(np.int32)
    start = np.concatenate([[0], np.cumsum(df[:-1], dtype=np.int64)]) if len(terms) else \
        np.zeros(0, np.int64)
    batches = [
        pa.record_batch({"term": terms.cast(pa.string()), "df": df, "start": start}),
        pa.record_batch({"row": counted["row"].combine_chunks(),
                         "tf": pc.cast(counted["count_all"], pa.int32()).combine_chunks()}),
        pa.record_batch({"length": lengths}),
    ]
    out = pa.BufferOutputStream()
    for batch in batches:
        with pa.ipc.new_stream(out, batch.schema) as writer:
            writer.write_batch(batch)
    summary = {
        "rows": n,
        "total_length": int(lengths.sum()),
        "terms": len(terms),
        "bloom": bloom_build(terms.to_pylist()),
    }
    return out.getvalue().to_pybytes(), summary


class TextIndex:
    """A loaded superfile index: term lookup and postings."""

    def __init__(self, data: bytes) -> None:
        reader = pa.BufferReader(data)
        tables = []
        for _ in range(3):
            stream = pa.ipc.open_stream(reader)
            tables.append(stream.read_all())
        terms, post, lengths = tables
        self.terms = terms.column("term").to_numpy(zero_copy_only=False)
        self.df = terms.column("df").to_numpy()
        self.start = terms.column("start").to_numpy()
        self.rows = post.column("row").to_numpy()
        self.tf = post.column("tf").to_numpy()
        self.lengths = lengths.column("length").to_numpy()
        self._lookup = {t: i for i, t in enumerate(self.terms)}
        self._tf64: Optional[np.ndarray] = None
        self._norm: Optional[Tuple[float, np.ndarray]] = None
        # The arrays are views of ``data``; the terms as Python strings and
        # the lookup dict cost about a hundred bytes a term more; scoring
        # keeps the term frequencies as floats and a length norm per row.
        self.nbytes = len(data) + TERM_OVERHEAD_BYTES * len(self.terms) + \
            8 * (len(self.tf) + len(self.lengths))

    def tf_float(self) -> np.ndarray:
        """``tf`` as float64 (what BM25 computes with), converted once."""
        if self._tf64 is None:
            self._tf64 = self.tf.astype(np.float64)
        return self._tf64

    def length_norm(self, avg_len: float, k1: float = 1.2, b: float = 0.75) -> np.ndarray:
        """Each row's ``k1 * (1 - b + b * length / avg_len)``, BM25's length term, as
        :func:`bm25` computes it; kept until the collection's average length changes."""
        held = self._norm
        if held is None or held[0] != avg_len:
            held = self._norm = (avg_len, k1 * (1 - b + b * self.lengths / max(avg_len, 1e-9)))
        return held[1]

    def postings(self, term: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        i = self._lookup.get(term)
        if i is None:
            return None
        s, n = self.start[i], self.df[i]
        return self.rows[s:s + n], self.tf[s:s + n]

    def span(self, term: str) -> Tuple[int, int]:
        """Where ``term``'s postings are in ``rows`` and ``tf`` (a term of the index)."""
        i = self._lookup[term]
        s = int(self.start[i])
        return s, s + int(self.df[i])

    def __contains__(self, term: str) -> bool:
        return term in self._lookup

    def doc_freq(self, term: str) -> int:
        i = self._lookup.get(term)
        return 0 if i is None else int(self.df[i])


def _hashes(term: str, m: int) -> List[int]:
    h = hashlib.blake2b(term.encode(), digest_size=16).digest()
    a, b = int.from_bytes(h[:8], "little"), int.from_bytes(h[8:], "little") | 1
    return [(a + i * b) % m for i in range(BLOOM_HASHES)]


def bloom_build(terms: Sequence[str]) -> str:
    nbytes = max(8, min(BLOOM_MAX_BYTES, (len(terms) * BLOOM_BITS_PER_TERM + 7) // 8))
    bits = np.zeros(nbytes * 8, dtype=bool)
    m = nbytes * 8
    for term in terms:
        bits[_hashes(term, m)] = True
    return base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode()


def bloom_bits(bloom: str) -> bytes:
    """The bit array of a manifest bloom filter (its base64 decoded)."""
    return base64.b64decode(bloom)


def bloom_may_contain(bloom: Union[str, bytes], term: str) -> bool:
    """False only when ``term`` is surely absent; ``bloom`` as in the manifest or decoded."""
    bits = bloom_bits(bloom) if isinstance(bloom, str) else bloom
    # Bit i is bit i % 8 of byte i // 8 (np.packbits(..., bitorder="little")).
    for i in _probe(term, len(bits) * 8):
        if not bits[i >> 3] >> (i & 7) & 1:
            return False
    return True


@functools.lru_cache(maxsize=8192)
def _probe(term: str, m: int) -> Tuple[int, ...]:
    # A query probes every superfile's filter for each term twice (statistics,
    # then scoring), and searches repeat terms: hashing was a tenth of a query.
    return tuple(_hashes(term, m))


def bm25(tf: np.ndarray, lengths: np.ndarray, df: int, n_docs: int, avg_len: float,
         k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    """Lucene's BM25: idf = ln(1 + (N - df + 0.5) / (df + 0.5))."""
    idf = np.log(1 + (n_docs - df + 0.5) / (df + 0.5))
    denom = tf + k1 * (1 - b + b * lengths / max(avg_len, 1e-9))
    return idf * tf * (k1 + 1) / denom


def bm25_idf(df: int, n_docs: int) -> float:
    """:func:`bm25`'s idf of a term, computed as it computes it."""
    return np.log(1 + (n_docs - df + 0.5) / (df + 0.5))


def bm25_postings(tf: np.ndarray, norm: np.ndarray, idf: np.ndarray, k1: float = 1.2
                  ) -> np.ndarray:
    """:func:`bm25` of several terms' postings at once: ``idf`` per posting, ``norm``
    the rows' :meth:`TextIndex.length_norm`.

    The same operations in the same order on each element, so each score is
    bit for bit :func:`bm25`'s.
    """
    return idf * tf * (k1 + 1) / (tf + norm)
