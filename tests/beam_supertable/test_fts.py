"""Tokenizer, BM25 against a plain reference, query syntax, bloom skipping."""

import math
import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable
from beam_supertable.fts.index import bloom_build, bloom_may_contain
from beam_supertable.fts.tokenize import contains_phrase, parse_query, tokenize

DOCS = [
    "The quick brown fox jumps over the lazy dog",
    "A quick brown dog outpaces a quick fox",
    "Lazy afternoons: the dog sleeps, the fox waits",
    "Foxes and dogs are not the same animal",
    "Brown bread, brown sugar, brown rice",
    "Über naïve café owners serve crème brûlée in 2024",
    "the the the the the",
    "Quick thinking saved the brown fox from the dog",
]


def test_tokenizer_is_unicode_aware_and_lowercases():
    assert tokenize("Über naïve CAFÉ_42 x-ray 3.14") == ["über", "naïve", "café", "42", "x", "ray", "3", "14"]
    assert tokenize("a the cat", frozenset({"the", "a"})) == ["cat"]
    assert tokenize(None) == []


def test_query_syntax():
    terms, required, phrases = parse_query('brown +fox "lazy dog"')
    assert terms == ["brown", "fox", "lazy", "dog"]
    assert required == ["fox"]
    assert phrases == [["lazy", "dog"]]


def _reference_bm25(docs, query_terms, k1=1.2, b=0.75):
    toks = [tokenize(d) for d in docs]
    n = len(docs)
    avg = sum(map(len, toks)) / n
    out = []
    for i, t in enumerate(toks):
        tf = Counter(t)
        s = 0.0
        for q in query_terms:
            df = sum(1 for x in toks if q in x)
            if tf[q]:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += idf * tf[q] * (k1 + 1) / (tf[q] + k1 * (1 - b + b * len(t) / avg))
        out.append(s)
    return out


@pytest.fixture(params=[1, 3, len(DOCS)], ids=["one-superfile", "three-commits", "row-each"])
def corpus_table(request, tmp_path):
    schema = pa.schema([("n", pa.int64()), ("body", pa.string())])
    # The plain tokenizer, the one the references below model (English analysis
    # has its own reference checks in test_text_analysis.py).
    t = Supertable.create(str(tmp_path / "t"), schema, fts_columns=["body"], text_analysis="none")
    chunks = np.array_split(np.arange(len(DOCS)), request.param)
    for chunk in chunks:
        t.append(pa.table({"n": chunk, "body": [DOCS[i] for i in chunk]}))
    return t


def test_bm25_scores_match_the_reference_however_rows_were_split(corpus_table):
    got = corpus_table.search(text="brown fox", k=len(DOCS))
    ref = _reference_bm25(DOCS, ["brown", "fox"])
    expected = sorted(((s, i) for i, s in enumerate(ref) if s > 0), key=lambda t: (-t[0], t[1]))
    assert [r["n"] for r in got.to_pylist()] == [i for _, i in expected]
    np.testing.assert_allclose(got["_score"].to_numpy(), [s for s, _ in expected], rtol=1e-5)


def test_required_terms_and_phrases(corpus_table):
    hits = corpus_table.search(text="brown +dog", k=10)
    assert set(hits["n"].to_pylist()) == {0, 1, 2, 7}  # every row holding "dog"
    scores = hits["_score"].to_pylist()
    assert scores == sorted(scores, reverse=True)
    assert corpus_table.search(text='"lazy dog"', k=10)["n"].to_pylist() == [0]
    assert corpus_table.search(text='"dog lazy"', k=10).num_rows == 0
    assert corpus_table.search(text="crème", k=3)["n"].to_pylist() == [5]
    assert corpus_table.search(text="zebra", k=3).num_rows == 0


def _reference_search(docs, query, k, allowed=None):
    """Plain BM25 over every doc, then the +required and phrase conditions, best k."""
    terms, required, phrases = parse_query(query)
    scores = _reference_bm25(docs, terms)
    out = []
    for i, doc in enumerate(docs):
        toks = tokenize(doc)
        if not any(t in toks for t in terms) or not all(t in toks for t in required):
            continue
        if not all(contains_phrase(toks, ph) for ph in phrases):
            continue
        if allowed is None or allowed(i):
            out.append((scores[i], i))
    out.sort(key=lambda t: (-t[0], t[1]))
    return out[:k]


def _assert_same_hits(got, expected):
    """Same rows with the same scores; rows tied on score may come in either order."""
    mine = sorted(zip(got["n"].to_pylist(), got["_score"].to_pylist()))
    theirs = sorted((i, s) for s, i in expected)
    assert [n for n, _ in mine] == [i for i, _ in theirs]
    np.testing.assert_allclose([s for _, s in mine], [s for _, s in theirs], rtol=1e-6)
    np.testing.assert_allclose(got["_score"].to_numpy(), [s for s, _ in expected], rtol=1e-6)


@pytest.mark.parametrize("query", ["brown +dog", "+fox +dog quick", '"brown fox" dog',
                                   '+the "lazy dog"', 'quick "brown dog" +outpaces'])
def test_required_terms_and_phrases_score_as_over_the_whole_collection(corpus_table, query):
    got = corpus_table.search(text=query, k=len(DOCS))
    _assert_same_hits(got, _reference_search(DOCS, query, len(DOCS)))


def test_a_filter_does_not_change_the_scores(corpus_table):
    # A filter (and the superfiles its statistics prune) restricts the rows,
    # not the collection BM25's statistics come from.
    got = corpus_table.search(text="brown fox", k=len(DOCS), filter=pc.field("n") >= 4)
    _assert_same_hits(got, _reference_search(DOCS, "brown fox", len(DOCS), lambda i: i >= 4))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.lists(st.sampled_from("ant bee cat dog eel fox".split()),
                              min_size=1, max_size=8).map(" ".join), min_size=1, max_size=12),
       splits=st.integers(min_value=1, max_value=5),
       query=st.sampled_from(["bee", "ant +cat", "+dog +eel fox", '"ant bee"', 'cat "dog eel"',
                              '+fox "bee bee" ant']),
       k=st.integers(min_value=1, max_value=6))
def test_text_search_is_the_reference_however_rows_are_split(docs, splits, query, k):
    t = Supertable.create(f"memory://fts/{uuid.uuid4().hex}",
                          pa.schema([("n", pa.int64()), ("body", pa.string())]),
                          fts_columns=["body"])
    for chunk in np.array_split(np.arange(len(docs)), min(splits, len(docs))):
        t.append(pa.table({"n": chunk, "body": [docs[i] for i in chunk]}))
    expected = _reference_search(docs, query, len(docs))
    got = t.search(text=query, k=k)
    # The k best: the reference's first k scores, rows free among ties at the cut.
    np.testing.assert_allclose(got["_score"].to_numpy(), [s for s, _ in expected[:k]], rtol=1e-6)
    score_of = {i: s for s, i in expected}
    for n, s in zip(got["n"].to_pylist(), got["_score"].to_pylist()):
        assert score_of[n] == pytest.approx(s, rel=1e-6)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.lists(st.sampled_from("ant bee cat dog eel fox".split()),
                              min_size=1, max_size=8).map(" ".join), min_size=1, max_size=12),
       splits=st.integers(min_value=1, max_value=4),
       gone=st.sets(st.integers(min_value=0, max_value=11)),
       query=st.sampled_from(["bee", "ant +cat", "+dog +eel fox", '"ant bee"', "fox eel"]))
def test_text_search_scores_over_the_live_rows_only(docs, splits, gone, query):
    """Deleted rows still in their superfiles count in no BM25 statistic: the
    scores are the reference's over the live rows alone."""
    t = Supertable.create(f"memory://fts/{uuid.uuid4().hex}",
                          pa.schema([("n", pa.int64()), ("body", pa.string())]),
                          fts_columns=["body"])
    for chunk in np.array_split(np.arange(len(docs)), min(splits, len(docs))):
        t.append(pa.table({"n": chunk, "body": [docs[i] for i in chunk]}))
    gone = sorted(i for i in gone if i < len(docs))
    if gone:
        t.delete(pc.field("n").isin(gone))
    live = [i for i in range(len(docs)) if i not in gone]
    got = t.search(text=query, k=len(docs))
    if not live:
        assert got.num_rows == 0
        return
    expected = [(s, live[j]) for s, j in
                _reference_search([docs[i] for i in live], query, len(live))]
    _assert_same_hits(got, expected)


def test_bloom_filter_has_no_false_negatives_and_few_false_positives():
    terms = [f"term{i}" for i in range(2000)]
    bloom = bloom_build(terms)
    assert all(bloom_may_contain(bloom, t) for t in terms)
    fp = sum(bloom_may_contain(bloom, f"other{i}") for i in range(2000))
    assert fp < 60  # ~1% at 10 bits per term


def test_text_search_skips_superfiles_without_the_terms(tmp_path):
    schema = pa.schema([("body", pa.string())])
    batches = [pa.table({"body": [f"common words only {j}" for j in range(50)]
                         + ([f"needle{i}"] if i == 3 else [])}) for i in range(6)]
    six = Supertable.create(str(tmp_path / "six"), schema, fts_columns=["body"])
    for batch in batches:
        six.append(batch)
    one = Supertable.create(str(tmp_path / "one"), schema, fts_columns=["body"])
    one.append(batches[3])
    reads = []
    for uri in (tmp_path / "six", tmp_path / "one"):
        t = Supertable.open(str(uri))
        assert t.search(text="needle3", k=5)["body"].to_pylist() == ["needle3"]
        reads.append(t.io.snapshot())
    # Six superfiles cost what the one holding the term costs: the others
    # are neither opened nor read. (The same rows under other `_id`s encode
    # a few bytes apart, so bytes are compared to within 2 %.)
    assert reads[0]["requests"] == reads[1]["requests"]
    assert abs(reads[0]["bytes"] - reads[1]["bytes"]) <= 0.02 * reads[1]["bytes"]


def test_bm25_after_upserts_and_two_deletes_equals_a_fresh_table(tmp_path):
    """Rows replaced by upsert and deleted by two separate commits count in no
    BM25 statistic, on the writing handle and on a fresh one."""
    schema = pa.schema([("id", pa.int64()), ("body", pa.string())])
    docs = {i: " ".join(["ant", "bee", "cat", "dog"][: 1 + i % 4] + ["eel"] * (i % 3))
            for i in range(30)}
    a = Supertable.create(str(tmp_path / "a"), schema, primary_key="id", fts_columns=["body"])
    a.append(pa.table({"id": list(docs), "body": list(docs.values())}, schema=schema))
    a.upsert(pa.table({"id": [1, 2, 3], "body": ["fox", "fox fox", None]}, schema=schema))
    a.search(text="bee", k=50)   # warm the caches of this handle
    a.delete(pc.field("id").isin([5, 6]))
    a.upsert(pa.table({"id": [2, 40], "body": ["bee fox", "bee"]}, schema=schema))
    a.delete(pc.field("id").isin([7]))
    live = dict(docs)
    live.update({1: "fox", 3: None, 2: "bee fox", 40: "bee"})
    for gone in (5, 6, 7):
        live.pop(gone)
    b = Supertable.create(str(tmp_path / "b"), schema, primary_key="id", fts_columns=["body"])
    b.append(pa.table({"id": list(live), "body": list(live.values())}, schema=schema))

    def hits(t, q):
        res = t.search(text=q, k=100, columns=["id"])
        score = [c for c in res.column_names if c != "id"][-1]
        return sorted(zip(res["id"].to_pylist(), np.round(res[score].to_numpy(), 6)))
    for q in ("bee", "fox", "eel cat", "+bee fox"):
        want = hits(b, q)
        assert hits(a, q) == want, q
        assert hits(Supertable.open(str(tmp_path / "a")), q) == want, q
