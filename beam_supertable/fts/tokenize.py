"""Unicode-aware tokenizer: lowercase words of letters and digits."""

from __future__ import annotations

import re
from typing import FrozenSet, Iterable, List, Optional, Tuple

_WORD = re.compile(r"[^\W_]+")
_QUERY = re.compile(r'(\+?)"([^"]*)"|(\+?)([^\s"]+)')


def tokenize(text: Optional[str], stop_words: FrozenSet[str] = frozenset()) -> List[str]:
    if not text:
        return []
    words = _WORD.findall(text.lower())
    return [w for w in words if w not in stop_words] if stop_words else words


def parse_query(query: str, stop_words: FrozenSet[str] = frozenset()
                ) -> Tuple[List[str], List[str], List[List[str]]]:
    """Splits a query into (terms, required terms, phrases).

    ``+word`` requires a term; ``"a phrase"`` requires the exact phrase (its
    words also rank); other words rank by BM25 (OR).
    """
    terms: List[str] = []
    required: List[str] = []
    phrases: List[List[str]] = []
    for plus_phrase, phrase, plus_word, word in _QUERY.findall(query):
        if phrase or plus_phrase:
            words = tokenize(phrase, stop_words)
            if words:
                phrases.append(words)
                terms.extend(words)
            continue
        words = tokenize(word, stop_words)
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
