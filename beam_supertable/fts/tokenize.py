"""Unicode-aware tokenizer: lowercase words of letters and digits.

One implementation (Arrow's ``utf8_lower`` and a RE2 split on everything that
is not a Unicode letter or number) serves indexing, queries and phrase checks,
so they can never disagree on what a word is.
"""

from __future__ import annotations

import re
from typing import Callable, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NOT_WORD = r"[^\p{L}\p{N}]+"
_ASCII_NOT_WORD = re.compile(r"[^a-z0-9]+")
_QUERY = re.compile(r'(\+?)"([^"]*)"|(\+?)([^\s"]+)')


def tokenize_column(texts, stop_words: FrozenSet[str] = frozenset()
                    ) -> Tuple[pa.Array, np.ndarray]:
    """All tokens of a string column, flat, with the row each came from."""
    texts = pa.array(texts, pa.string()) if not isinstance(texts, (pa.Array, pa.ChunkedArray)) \
        else texts
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    lists = pc.split_pattern_regex(pc.utf8_lower(pc.fill_null(texts, "")), _NOT_WORD)
    flat = pc.list_flatten(lists)
    rows = pc.list_parent_indices(lists).to_numpy()
    keep = pc.greater(pc.binary_length(flat), 0)
    if stop_words:
        keep = pc.and_(keep, pc.invert(pc.is_in(flat, value_set=pa.array(sorted(stop_words)))))
    mask = keep.to_numpy(zero_copy_only=False)
    return flat.filter(keep), rows[mask]


def tokenize(text: Optional[str], stop_words: FrozenSet[str] = frozenset()) -> List[str]:
    if not text:
        return []
    if text.isascii():
        # The same words as tokenize_column: on ASCII, lowering is A-Z -> a-z
        # and letters-or-numbers is [a-z0-9]; it skips compiling the Unicode
        # pattern (~0.7 ms a call), which dominated a query's parse.
        return [w for w in _ASCII_NOT_WORD.split(text.lower()) if w and w not in stop_words]
    return tokenize_column([text], stop_words)[0].to_pylist()


def tokenize_many(texts: Sequence[Optional[str]], stop_words: FrozenSet[str] = frozenset()
                  ) -> List[List[str]]:
    flat, rows = tokenize_column(list(texts), stop_words)
    bounds = np.searchsorted(rows, np.arange(len(texts) + 1))
    words = flat.to_pylist()
    return [words[bounds[i]:bounds[i + 1]] for i in range(len(texts))]


def parse_query(query: str, stop_words: FrozenSet[str] = frozenset()
                ) -> Tuple[List[str], List[str], List[List[str]]]:
    """Splits a query into (terms, required terms, phrases).

    ``+word`` requires a term; ``"a phrase"`` requires the exact phrase (its
    words also rank); other words rank by BM25 (OR).
    """
    return parse_query_with(query, lambda text: tokenize(text, stop_words))


def parse_query_with(query: str, words_of: Callable[[str], List[str]]
                     ) -> Tuple[List[str], List[str], List[List[str]]]:
    """:func:`parse_query` with ``words_of`` turning each word or phrase into terms."""
    terms: List[str] = []
    required: List[str] = []
    phrases: List[List[str]] = []
    for plus_phrase, phrase, plus_word, word in _QUERY.findall(query):
        if phrase or plus_phrase:
            words = words_of(phrase)
            if words:
                phrases.append(words)
                terms.extend(words)
            continue
        words = words_of(word)
        terms.extend(words)
        if plus_word:
            required.extend(words)
    return _dedupe(terms), _dedupe(required), phrases


def _dedupe(items: Iterable[str]) -> List[str]:
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def contains_phrase(tokens: List[str], phrase: List[str]) -> bool:
    n = len(phrase)
    first = phrase[0]
    for i, tok in enumerate(tokens):
        if tok == first and tokens[i:i + n] == phrase:
            return True
    return False
