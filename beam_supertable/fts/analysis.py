"""Text analysis: the tokenizer, then stop words, then a Snowball stemmer.

English analysis drops Lucene's 33 English stop words (``stop_words: "lucene"``);
tables created when it dropped Snowball's 125 record ``stop_words: True`` and keep
them.

A table's analysis is a table property (``fts.analysis``) fixed at create, and
one :class:`Analyzer` built from it serves indexing, queries and phrase checks,
so a word is always reduced to the same term on both sides. A table whose
property has no ``analysis`` (created before analysis existed) gets the plain
tokenizer, so its stored term dictionaries stay valid.

Stop words are matched against the lowercased word before stemming (the list
holds words as written, not stems). Stemming uses PyStemmer (the Snowball
stemmers, in C), imported only by tables that stem.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.fts import tokenize as tok

LANGUAGES = ("english",)

# The Snowball project's English stop-word list, without its contractions (the
# tokenizer splits "isn't" into "isn" and "t"), plus the "s" and "t" such splits
# leave: the English list of tables created with ``stop_words: True`` (the default
# before the shorter list; they keep it).
SNOWBALL_STOP_WORDS: FrozenSet[str] = frozenset("""
a about above after again against all am an and any are as at be because been before
being below between both but by could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is
it its itself me more most my myself no nor not of off on once only or other ought our
ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why with would you your yours yourself yourselves s t
""".split())
ENGLISH_STOP_WORDS = SNOWBALL_STOP_WORDS   # (its name before the shorter list)

# Lucene's (and Elasticsearch's) English analyzer's 33 stop words: articles,
# conjunctions and prepositions, none of the words a question is made of
# ("about", "would", "through", "should" ... stay).
LUCENE_STOP_WORDS: FrozenSet[str] = frozenset("""
a an and are as at be but by for if in into is it no not of on or such that the their then
there these they this to was will with
""".split())

# ``stop_words`` of an analysis: False, or the list it names (True: Snowball's).
STOP_LISTS = {"snowball": SNOWBALL_STOP_WORDS, "lucene": LUCENE_STOP_WORDS}

# What ``text_analysis=`` names, as the recorded property. English: Snowball stemming
# and Lucene's 33 stop words, chosen by measurement on ``benchmarks.text_bench``'s two
# corpora (Snowball's 125 words lost queries holding "about", "would", "through" ...;
# no stop words at all ranked a little lower than the 33).
ENGLISH = {"language": "english", "stemming": True, "stop_words": "lucene"}
# English as recorded by tables created before the shorter list: they keep it.
ENGLISH_BEFORE = {"language": "english", "stemming": True, "stop_words": True}
PLAIN = {"language": "english", "stemming": False, "stop_words": False}

AnalysisArg = Union[None, bool, str, Mapping[str, Any]]


class _Default(dict):
    """English analysis as ``create``'s default, told apart from the same dict given."""


DEFAULT: Mapping[str, Any] = _Default(ENGLISH)


def normalize(value: AnalysisArg, where: str = "text_analysis") -> Dict[str, Any]:
    """The property recorded for ``create(text_analysis=value)``.

    ``"english"`` and ``True`` are English analysis (Snowball stemming, Lucene's 33
    English stop words); ``None``, ``False`` and ``"none"`` the plain tokenizer; a
    dict sets ``language``, ``stemming`` (a bool) and ``stop_words``: ``"lucene"``
    (the default), ``"snowball"`` (Snowball's 125 English stop words; ``True`` too,
    as tables created before the shorter list record it) or ``False``.
    """
    if value is True or value == "english":
        return dict(ENGLISH)
    if value is None or value is False or value == "none":
        return dict(PLAIN)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected 'english', None (or 'none'), a bool or a dict "
                         f"with 'language', 'stemming', 'stop_words'; got {value!r}")
    unknown = sorted(set(value) - set(ENGLISH))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; the keys are "
                         f"'language', 'stemming', 'stop_words'")
    out = dict(ENGLISH)
    out.update(value)
    if out["language"] not in LANGUAGES:
        raise ValueError(f"{where}: language {out['language']!r} is not supported; "
                         f"supported: {list(LANGUAGES)}")
    if not isinstance(out["stemming"], bool):
        raise ValueError(f"{where}: 'stemming' must be True or False, got {out['stemming']!r}")
    if not isinstance(out["stop_words"], bool) and out["stop_words"] not in STOP_LISTS:
        raise ValueError(f"{where}: 'stop_words' must be True, False or one of "
                         f"{sorted(STOP_LISTS)}, got {out['stop_words']!r}")
    return out


@dataclass(frozen=True)
class Analyzer:
    """Words of a text: tokenize, drop ``stop_words``, stem with ``stemmer`` (a Snowball
    language) when set. Plain data: pickles into pipelines and compares by value."""

    stop_words: FrozenSet[str] = frozenset()
    stemmer: Optional[str] = None

    def tokenize(self, text: Optional[str]) -> List[str]:
        words = tok.tokenize(text, self.stop_words)
        if self.stemmer is None or not words:
            return words
        return _stemmer(self.stemmer).stemWords(words)

    def tokenize_column(self, texts) -> Tuple[pa.Array, np.ndarray]:
        """All terms of a string column, flat, with the row each came from."""
        flat, rows = tok.tokenize_column(texts, self.stop_words)
        if self.stemmer is None or not len(flat):
            return flat, rows
        # Each distinct word is stemmed once; the terms are gathered back by index.
        encoded = pc.dictionary_encode(flat)
        stems = pa.array(_stemmer(self.stemmer).stemWords(encoded.dictionary.to_pylist()),
                         pa.string())
        return stems.take(encoded.indices), rows

    def tokenize_many(self, texts: Sequence[Optional[str]]) -> List[List[str]]:
        flat, rows = self.tokenize_column(list(texts))
        bounds = np.searchsorted(rows, np.arange(len(texts) + 1))
        words = flat.to_pylist()
        return [words[bounds[i]:bounds[i + 1]] for i in range(len(texts))]

    def parse_query(self, query: str) -> Tuple[List[str], List[str], List[List[str]]]:
        """(terms, required terms, phrases), as :func:`tokenize.parse_query`, analyzed."""
        if '"' not in query and "+" not in query:
            # Words only: the query's words are its terms, analyzed in one call.
            return tok._dedupe(self.tokenize(query)), [], []
        return tok.parse_query_with(query, self.tokenize)


def analyzer_of(fts_props: Optional[Mapping[str, Any]]) -> Analyzer:
    """The analyzer a table's ``fts`` property describes (plain when it has no analysis)."""
    if not fts_props:
        return Analyzer()
    analysis = fts_props.get("analysis")
    return _analyzer(tuple(fts_props.get("stop_words", ())),
                     None if analysis is None else
                     (analysis.get("language"), bool(analysis.get("stemming")),
                      _stop_list(analysis.get("stop_words"))))


def _stop_list(switch: Any) -> Optional[str]:
    """The stop list an analysis' ``stop_words`` names: True (as recorded by tables
    created before the shorter list) is Snowball's, False or absent none."""
    if switch is True:
        return "snowball"
    return switch if switch in STOP_LISTS else None


@functools.lru_cache(maxsize=64)
def _analyzer(custom: Tuple[str, ...], analysis: Optional[Tuple[str, bool, Optional[str]]]
              ) -> Analyzer:
    # Cached: a search builds the analyzer from the properties every time.
    if analysis is None:
        return Analyzer(frozenset(custom))
    language, stemming, stop_list = analysis
    words = frozenset(custom) | STOP_LISTS[stop_list] if stop_list else frozenset(custom)
    return Analyzer(words, language if stemming else None)


def as_analyzer(value: Union[Analyzer, FrozenSet[str], Sequence[str], None]) -> Analyzer:
    """An :class:`Analyzer`, or the plain one dropping the stop words ``value``."""
    if isinstance(value, Analyzer):
        return value
    return Analyzer(frozenset(value or ()))


_LOCAL = threading.local()


def _stemmer(language: str):
    # One stemmer per thread: a PyStemmer object keeps a cache and must not be
    # shared between threads.
    stemmers = getattr(_LOCAL, "stemmers", None)
    if stemmers is None:
        stemmers = _LOCAL.stemmers = {}
    s = stemmers.get(language)
    if s is None:
        try:
            import Stemmer
        except ImportError:
            raise ImportError("a table with stemming needs PyStemmer: pip install PyStemmer"
                              ) from None
        s = stemmers[language] = Stemmer.Stemmer(language)
    return s


def fts_property(columns: Sequence[str], stop_words: Sequence[str],
                 text_analysis: AnalysisArg) -> Dict[str, Any]:
    """The ``fts`` table property ``create`` records (``check_stop_words`` says
    which stop words a new table refuses)."""
    return {"columns": list(columns),
            "stop_words": sorted({_lowered(w) for w in stop_word_list(stop_words)}),
            "analysis": normalize(text_analysis)}


def stop_word_list(stop_words: Optional[Sequence[str]]) -> List[str]:
    """``stop_words`` as a list (None: none), once checked to be one of strings."""
    if stop_words is None:
        return []
    if isinstance(stop_words, (str, bytes)) or not isinstance(stop_words, Iterable) \
            or isinstance(stop_words, Mapping):
        raise TypeError(f"stop_words must be a list of words, got {stop_words!r}")
    words = list(stop_words)   # (read once: it may be an iterator)
    for word in words:
        if not isinstance(word, str):
            raise TypeError(f"stop_words: {word!r} is not a string")
    return words


def _lowered(word: str) -> str:
    """``word`` lowered as the tokenizer lowers a text (``casefold`` would turn
    "Straße" into "strasse", a word no text then holds)."""
    return pc.utf8_lower(pa.scalar(word, pa.string())).as_py()


def check_stop_words(stop_words: Sequence[str]) -> None:
    """Refuses a stop word that is not a word as the tokenizer reads one (it reads
    "don't" as two, "C++" as "c"): it could never be dropped as given."""
    for word in stop_word_list(stop_words):
        words = tok.tokenize(word)
        if words != [_lowered(word)]:
            raise ValueError(f"stop_words: {word!r} is not a word as the tokenizer reads "
                             f"one (it reads {words})")


def matchable(stop_words: Sequence[str]) -> List[str]:
    """The stored stop words the tokenizer can match (the others never dropped a word)."""
    return [w for w in stop_words if tok.tokenize(w) == [w]]


def held_if_not_given(props: Dict[str, Any], held: Mapping[str, Any],
                      given: bool, stop_words: Sequence[str] = ()) -> Dict[str, Any]:
    """``props``, with the held table's analysis unless ``text_analysis`` was ``given``:
    ``create(mode="exist_ok")`` without it opens a table whatever its analysis. A table
    created before analysis existed has none: it is the plain tokenizer's, given or not."""
    mine, theirs = props.get("fts"), held.get("fts")
    if not mine or not theirs:
        return props
    fts = dict(mine)
    # A table created before stop words were lowered the tokenizer's way holds
    # the given ``stop_words`` casefolded: they still open it, as it is.
    if theirs.get("stop_words") == sorted({w.casefold() for w in stop_words}):
        fts["stop_words"] = theirs["stop_words"]
    if mine.get("analysis") == ENGLISH and theirs.get("analysis") == ENGLISH_BEFORE:
        given = False   # "english" opens a table created when it named the longer list
    if not given or ("analysis" not in theirs and mine.get("analysis") == PLAIN):
        fts.pop("analysis", None)
        if "analysis" in theirs:
            fts["analysis"] = theirs["analysis"]
    return {**props, "fts": fts}
