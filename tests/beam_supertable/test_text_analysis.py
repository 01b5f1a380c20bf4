"""English text analysis: stems, stop words, their switches, and tables keeping theirs."""

import math
import uuid
from collections import Counter

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable, WriteToSupertable
from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.manifest import Manifest
from beam_supertable.format.store import ObjectStore
from beam_supertable.fts.analysis import (ENGLISH_BEFORE, LUCENE_STOP_WORDS, SNOWBALL_STOP_WORDS,
                                          Analyzer, analyzer_of, normalize)
from beam_supertable.fts.index import TextIndex
from beam_supertable.fts.tokenize import contains_phrase, parse_query, parse_query_with, tokenize
from beam_supertable.rag import chunk_schema, migrate_chunk_table

SCHEMA = pa.schema([("n", pa.int64()), ("body", pa.string())])
ENGLISH = analyzer_of({"columns": ["body"], "analysis": normalize("english")})
DOUGH = [
    "Bread dough rises because yeast ferments the sugars and releases carbon dioxide.",
    "Tides rise and fall twice a day.",
    "The moon pulls on the oceans of the earth.",
]
# Words with their inflections, stop words and non-ASCII letters.
WORDS = ("rise rises rising risen tide tides run runs running ran class classes the a of "
         "is not why does über naïve café Dough DOUGH x-ray 42").split()


def _table(uri, docs, **kwargs):
    t = Supertable.create(uri, SCHEMA, fts_columns=["body"], **kwargs)
    t.append(pa.table({"n": list(range(len(docs))), "body": docs}, schema=SCHEMA))
    return t


def _created_before_analysis(uri, **kwargs):
    """A table as created before analysis existed: its ``fts`` property has none."""
    full, props = Supertable.describe_create(uri, SCHEMA, fts_columns=["body"], **kwargs)
    del props["fts"]["analysis"]
    Manifest(ObjectStore(uri)).create(full, props)
    return Supertable.open(uri)


def _terms(table):
    """Every term of the table's text indexes."""
    out = set()
    for e in table.superfiles():
        out |= set(TextIndex(table._reader(e).section_range(
            "text", 0, table._reader(e).header["sections"]["text"][1])).terms.tolist())
    return out


def test_english_analysis_stems_and_drops_lucenes_33_stop_words():
    assert ENGLISH.tokenize("Why does the dough RISE? Running classes, tides rising") == [
        "whi", "doe", "dough", "rise", "run", "class", "tide", "rise"]
    assert ENGLISH.tokenize(None) == [] and ENGLISH.tokenize("the a of") == []
    assert len(LUCENE_STOP_WORDS) == 33 and LUCENE_STOP_WORDS < SNOWBALL_STOP_WORDS | {"will"}
    # The words a question is made of stay.
    assert ENGLISH.tokenize("about what would go through") == [
        "about", "what", "would", "go", "through"]
    snowball = analyzer_of({"analysis": normalize({"stop_words": "snowball"})})
    assert snowball.tokenize("about what would go through") == ["go"]
    assert snowball == analyzer_of({"analysis": ENGLISH_BEFORE})


def test_each_switch_turns_off_its_step_alone():
    text = "Why does the dough rise? Running classes"
    stems = analyzer_of({"analysis": normalize({"stop_words": False})})
    stops = analyzer_of({"analysis": normalize({"stemming": False})})
    off = analyzer_of({"analysis": normalize("none")})
    assert stems.tokenize(text) == ["whi", "doe", "the", "dough", "rise", "run", "class"]
    assert stops.tokenize(text) == ["why", "does", "dough", "rise", "running", "classes"]
    assert off.tokenize(text) == tokenize(text)
    assert off == analyzer_of({"columns": ["body"]}) == Analyzer()


def test_custom_stop_words_join_the_english_ones_and_match_words_before_stemming():
    a = analyzer_of({"stop_words": ["dough"], "analysis": normalize("english")})
    assert a.tokenize("the doughs and the dough rise") == ["dough", "rise"]


@pytest.mark.parametrize("bad, named", [
    ("French", "'French'"), ({"language": "klingon"}, "klingon"),
    ({"stemming": "yes"}, "'stemming'"), ({"stemmer": True}, "['stemmer']"),
    ({"stop_words": "french"}, "'french'")])
def test_a_bad_text_analysis_is_refused_naming_it(tmp_path, bad, named):
    with pytest.raises(ValueError, match="text_analysis") as err:
        Supertable.create(str(tmp_path / "t"), SCHEMA, fts_columns=["body"], text_analysis=bad)
    assert named in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "t").exists()


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join)
                      | st.text(max_size=30), min_size=1, max_size=6),
       stemming=st.booleans(), stop_words=st.sampled_from([False, True, "lucene", "snowball"]))
def test_a_column_is_analyzed_as_each_of_its_texts_is(texts, stemming, stop_words):
    """The index analyzes a whole column, a query one text: they agree word for word."""
    a = analyzer_of({"analysis": normalize({"stemming": stemming, "stop_words": stop_words})})
    assert a.tokenize_many(texts) == [a.tokenize(t) for t in texts]


@settings(max_examples=60, deadline=None)
@given(query=st.lists(st.sampled_from(WORDS + ["+rise", '"dough rises"', "don't", "a-b"]),
                      max_size=6).map(" ".join) | st.text(max_size=30),
       stop_words=st.sampled_from([False, "lucene", "snowball"]))
def test_a_query_of_words_parses_as_each_word_analyzed(query, stop_words):
    """A query without ``+`` or quotes is read in one call: as each word read alone."""
    a = analyzer_of({"analysis": normalize({"stop_words": stop_words})})
    assert a.parse_query(query) == parse_query_with(query, a.tokenize)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join),
                     min_size=1, max_size=8),
       pick=st.integers(min_value=0), analysis=st.sampled_from(["english", "none"]))
def test_every_word_of_a_row_finds_that_row(docs, pick, analysis):
    """Written words, queried as written (any case), find their row on either analysis,
    with the BM25 of a plain reference over the analyzed terms."""
    t = _table(f"memory://analysis/{uuid.uuid4().hex}", docs, text_analysis=analysis)
    a = analyzer_of(t.properties["fts"])
    i = pick % len(docs)
    for word in docs[i].split():
        if not a.tokenize(word):
            continue   # a stop word: no term to find
        hits = t.search(text=word.upper(), k=len(docs))
        assert i in hits["n"].to_pylist()
        _assert_reference(hits, docs, word, a)


def _reference(docs, query, a, k1=1.2, b=0.75):
    """Plain BM25 over the analyzed words, +required and phrases applied."""
    toks = [a.tokenize(d) for d in docs]
    terms, required, phrases = a.parse_query(query)
    avg = sum(map(len, toks)) / len(docs)
    out = []
    for i, t in enumerate(toks):
        if not any(q in t for q in terms) or not all(q in t for q in required):
            continue
        if not all(contains_phrase(t, ph) for ph in phrases):
            continue
        tf, s = Counter(t), 0.0
        for q in terms:
            df = sum(1 for x in toks if q in x)
            if tf[q]:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                s += idf * tf[q] * (k1 + 1) / (tf[q] + k1 * (1 - b + b * len(t) / max(avg, 1e-9)))
        out.append((i, s))
    return sorted(out)


def _assert_reference(hits, docs, query, a):
    got = sorted(zip(hits["n"].to_pylist(), hits["_score"].to_pylist()))
    want = _reference(docs, query, a)
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5)


@pytest.mark.parametrize("query", ["why does dough rise", "+tides rising", '"dough rising"',
                                   "THE moon's oceans", '"fall twice" +rises'])
def test_english_scores_are_the_reference_over_analyzed_words(tmp_path, query):
    t = _table(str(tmp_path / "t"), DOUGH)
    _assert_reference(t.search(text=query, k=10), DOUGH, query, ENGLISH)


@pytest.mark.parametrize("english, stop_words", [
    ({}, "lucene"), ({"text_analysis": "english"}, "lucene"), ({"text_analysis": True}, "lucene"),
    ({"text_analysis": {"language": "english", "stemming": True, "stop_words": True}}, True),
    ({"text_analysis": {"stop_words": "snowball"}}, "snowball"),
    ({"text_analysis": {"stop_words": False}}, False)])
def test_why_does_dough_rise_finds_the_dough_first_on_a_new_table(tmp_path, english, stop_words):
    t = _table(str(tmp_path / "t"), DOUGH, **english)
    assert t.properties["fts"]["analysis"] == {
        "language": "english", "stemming": True, "stop_words": stop_words}
    assert t.search(text="why does dough rise", k=3)["n"].to_pylist() == [0, 1]
    # Phrases match analyzed words too: "dough rises" is the phrase "dough rise".
    assert t.search(text='"dough rising"', k=3)["n"].to_pylist() == [0]


@pytest.mark.parametrize("off", ["none", None, False, {"stemming": False, "stop_words": False}])
def test_a_table_with_analysis_off_answers_as_the_plain_tokenizer(tmp_path, off):
    off = _table(str(tmp_path / "off"), DOUGH, text_analysis=off)
    assert off.properties["fts"]["analysis"] == {
        "language": "english", "stemming": False, "stop_words": False}
    assert off.search(text="why does dough rise", k=3)["n"].to_pylist() == [1, 0]
    assert _terms(off) == {w for d in DOUGH for w in tokenize(d)}
    plain = Analyzer()
    _assert_reference(off.search(text="why does dough rise", k=3), DOUGH,
                      "why does dough rise", plain)
    assert parse_query("why does dough rise") == plain.parse_query("why does dough rise")


def test_a_table_created_before_analysis_keeps_the_plain_tokenizer(tmp_path):
    uri = str(tmp_path / "t")
    t = _created_before_analysis(uri, stop_words=["the"])
    t.append(pa.table({"n": [0, 1, 2], "body": DOUGH}, schema=SCHEMA))
    t.append(pa.table({"n": [3], "body": ["The dough rose."]}, schema=SCHEMA))
    assert "analysis" not in t.properties["fts"]
    want = [w for d in DOUGH + ["The dough rose."] for w in tokenize(d, frozenset({"the"}))]
    assert _terms(t) == set(want)
    before = t.search(text="why does dough rise", k=4)
    assert before["n"].to_pylist() == [1, 3, 0]   # "rise" is not "rises": the tides first
    _assert_reference(before, DOUGH + ["The dough rose."], "why does dough rise",
                      Analyzer(frozenset({"the"})))
    # Rewritten superfiles (optimize) and a fresh handle keep the table's tokenizer.
    t.optimize()
    assert len(t.superfiles()) == 1 and _terms(t) == set(want)
    after = Supertable.open(uri).search(text="why does dough rise", k=4)
    assert after["n"].to_pylist() == before["n"].to_pylist()
    np.testing.assert_allclose(after["_score"].to_numpy(), before["_score"].to_numpy())


def test_a_table_created_with_the_snowball_default_keeps_it(tmp_path):
    """English once dropped Snowball's 125 stop words: such a table records
    ``stop_words: True`` and indexes, searches, optimizes and reopens with them."""
    uri = str(tmp_path / "t")
    full, props = Supertable.describe_create(uri, SCHEMA, fts_columns=["body"])
    props["fts"]["analysis"] = dict(ENGLISH_BEFORE)
    Manifest(ObjectStore(uri)).create(full, props)
    docs = ["what it is about", "it is about bread", "bread rises"]
    t = Supertable.open(uri)
    t.append(pa.table({"n": [0, 1, 2], "body": docs}, schema=SCHEMA))
    assert _terms(t) == {"bread", "rise"}
    assert t.search(text="about", k=3).num_rows == 0
    for again in (Supertable.create(uri, SCHEMA, fts_columns=["body"], mode="exist_ok"),
                  Supertable.create(uri, SCHEMA, fts_columns=["body"], mode="exist_ok",
                                    text_analysis="english")):
        assert again.properties["fts"]["analysis"] == ENGLISH_BEFORE
    t.append(pa.table({"n": [3], "body": ["about the bread"]}, schema=SCHEMA))
    t.optimize()
    assert _terms(t) == {"bread", "rise"}
    assert Supertable.open(uri).properties["fts"]["analysis"]["stop_words"] is True
    # A new table (the default) finds what the old one dropped.
    new = _table(str(tmp_path / "new"), docs)
    assert new.properties["fts"]["analysis"]["stop_words"] == "lucene"
    assert new.search(text="about", k=3)["n"].to_pylist() == [0, 1]
    with pytest.raises(SchemaMismatchError, match="analysis"):
        Supertable.create(uri, SCHEMA, fts_columns=["body"], mode="exist_ok",
                          text_analysis={"stop_words": "lucene", "language": "english",
                                         "stemming": False})


def test_exist_ok_without_text_analysis_opens_a_table_of_any_analysis(tmp_path):
    old = _created_before_analysis(str(tmp_path / "old"))
    again = Supertable.create(old.uri, SCHEMA, fts_columns=["body"], mode="exist_ok")
    assert "analysis" not in again.properties["fts"]
    assert Supertable.create(old.uri, SCHEMA, fts_columns=["body"], mode="exist_ok",
                             text_analysis=None).version == old.version
    off = _table(str(tmp_path / "off"), [], text_analysis="none")
    assert Supertable.create(off.uri, SCHEMA, fts_columns=["body"], mode="exist_ok"
                             ).properties["fts"]["analysis"]["stemming"] is False
    with pytest.raises(SchemaMismatchError, match="fts"):
        Supertable.create(old.uri, SCHEMA, fts_columns=["body"], mode="exist_ok",
                          text_analysis="english")
    # Given, it must be the table's: the one recorded (here: off), not a default.
    assert Supertable.create(off.uri, SCHEMA, fts_columns=["body"], mode="exist_ok",
                             text_analysis=None).version == off.version
    with pytest.raises(SchemaMismatchError, match="analysis"):
        Supertable.create(off.uri, SCHEMA, fts_columns=["body"], mode="exist_ok",
                          text_analysis={"stemming": True, "stop_words": False})


def test_optimize_rebuilds_text_indexes_with_the_tables_analysis(tmp_path):
    t = _table(str(tmp_path / "t"), DOUGH[:2])
    t.append(pa.table({"n": [2], "body": DOUGH[2:]}, schema=SCHEMA))
    before = t.search(text="why does dough rise", k=3)
    t.optimize()
    assert len(t.superfiles()) == 1
    assert _terms(t) == {w for d in DOUGH for w in ENGLISH.tokenize(d)}
    after = t.search(text="why does dough rise", k=3)
    assert after["n"].to_pylist() == before["n"].to_pylist() == [0, 1]


def test_write_to_supertable_indexes_with_the_tables_analysis(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, fts_columns=["body"])
    with TestPipeline() as p:
        _ = (p | beam.Create([{"n": i, "body": d} for i, d in enumerate(DOUGH)])
             | WriteToSupertable(uri))
    t = Supertable.open(uri)
    assert _terms(t) == {w for d in DOUGH for w in ENGLISH.tokenize(d)}
    assert t.search(text="why does dough rise", k=3)["n"].to_pylist() == [0, 1]


def test_a_keyed_table_upserts_with_its_analysis(tmp_path):
    schema = pa.schema([("n", pa.int64()), ("body", pa.string())])
    t = Supertable.create(str(tmp_path / "t"), schema, primary_key="n", fts_columns=["body"])
    t.upsert(pa.table({"n": [0, 1, 2], "body": DOUGH}, schema=schema))
    t.upsert(pa.table({"n": [1], "body": ["Tides rise and fall."]}, schema=schema))
    assert t.search(text="why does dough rise", k=3)["n"].to_pylist() == [0, 1]
    assert t.search(text="falling tide", k=3)["n"].to_pylist() == [1]


@pytest.mark.parametrize("analysis", [None, "none", "before"])
def test_migrating_a_chunk_table_keeps_its_analysis(tmp_path, analysis):
    schema = chunk_schema(4)
    kwargs = dict(vector_column="embedding", fts_columns=["content"])
    uri = str(tmp_path / "chunks")
    if analysis == "before":
        full, props = Supertable.describe_create(uri, schema, **kwargs)
        del props["fts"]["analysis"]
        Manifest(ObjectStore(uri)).create(full, props)
    else:
        Supertable.create(uri, schema, text_analysis=analysis, **kwargs)
    src = Supertable.open(uri)
    src.append(pa.table({"id": ["a", "b", "c"], "content": DOUGH,
                         "embedding": [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]],
                         "metadata": ["{}"] * 3}, schema=schema))
    dst = str(tmp_path / "keyed")
    migrate_chunk_table(uri, dst)
    keyed = Supertable.open(dst)
    assert analyzer_of(keyed.properties["fts"]) == analyzer_of(src.properties["fts"])
    assert keyed.search(text="why does dough rise", k=3, columns=["id"])["id"].to_pylist() \
        == src.search(text="why does dough rise", k=3, columns=["id"])["id"].to_pylist()


def test_a_custom_stop_word_is_dropped_as_the_tokenizer_reads_it(tmp_path):
    # "Straße" lowered the tokenizer's way is "straße"; casefold's "strasse"
    # is a word no text holds, and the stop word would never be dropped.
    docs = ["Die Straße ist lang.", "Eine STRASSE am Meer.", "Die Straße und das Meer."]
    t = _table(str(tmp_path / "t"), docs, stop_words=["Straße", "Die"],
               text_analysis={"stemming": False, "stop_words": False})
    assert t.properties["fts"]["stop_words"] == ["die", "straße"]
    terms = _terms(t)
    assert "straße" not in terms and "die" not in terms and "strasse" in terms
    assert t.search(text="straße", k=3).num_rows == 0
    assert t.search(text="strasse meer", k=3)["n"].to_pylist()[0] == 1


@pytest.mark.parametrize("bad, error, words", [
    (["don't"], ValueError, "\"don't\" is not a word as the tokenizer reads one"),
    (["  "], ValueError, "'  ' is not a word as the tokenizer reads one"),
    (["C++"], ValueError, r"'C\+\+' is not a word as the tokenizer reads one \(it reads \['c'\]\)"),
    ("the", TypeError, "a list of words"),
    ([3], TypeError, "3 is not a string"),
    ({"the": 1}, TypeError, "a list of words"),
])
def test_a_stop_word_the_tokenizer_cannot_match_is_refused(tmp_path, bad, error, words):
    with pytest.raises(error, match=words):
        Supertable.create(str(tmp_path / "t"), SCHEMA, fts_columns=["body"], stop_words=bad)


def _created_with_casefolded_stop_words(uri, schema, words, **kwargs):
    """A table as created when stop words were stored casefolded, whole."""
    full, props = Supertable.describe_create(uri, schema, stop_words=["x"], **kwargs)
    props["fts"]["stop_words"] = sorted({w.casefold() for w in words})
    Manifest(ObjectStore(uri)).create(full, props)
    return Supertable.open(uri)


def test_a_table_holding_casefolded_stop_words_opens_and_migrates_with_them(tmp_path):
    words = ["Straße", "don't", "the", "C++", "'s"]
    uri = str(tmp_path / "t")
    held = _created_with_casefolded_stop_words(uri, SCHEMA, words, fts_columns=["body"])
    again = Supertable.create(uri, SCHEMA, fts_columns=["body"], stop_words=words,
                              mode="exist_ok")
    assert again.properties["fts"] == held.properties["fts"]
    for other in (["the"], ["Straße", "the"]):
        with pytest.raises(SchemaMismatchError, match="stop_words"):
            Supertable.create(uri, SCHEMA, fts_columns=["body"], stop_words=other,
                              mode="exist_ok")
    # Migrating keeps the words the tokenizer can match ("don't" never matched).
    src = _created_with_casefolded_stop_words(
        str(tmp_path / "chunks"), chunk_schema(4), words, vector_column="embedding",
        fts_columns=["content"])
    src.append(pa.table({"id": ["a", "b", "c"], "content": ["the strasse", "don't stop",
                                                            "c is a language; C++ another"],
                         "embedding": [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]],
                         "metadata": ["{}"] * 3}, schema=chunk_schema(4)))
    migrate_chunk_table(src.uri, str(tmp_path / "keyed"))
    keyed = Supertable.open(str(tmp_path / "keyed"))
    assert keyed.properties["fts"]["stop_words"] == ["strasse", "the"]
    for query in ("the strasse", "don't", "c", "s"):
        assert keyed.search(text=query, k=2, columns=["id"])["id"].to_pylist() == \
            src.search(text=query, k=2, columns=["id"])["id"].to_pylist()


def test_a_new_table_keeps_its_stop_words_as_given_however_they_come(tmp_path):
    def words():
        yield from ["Cat", "dog"]
    t = Supertable.create(str(tmp_path / "t"), SCHEMA, fts_columns=["body"],
                          stop_words=words())
    assert t.properties["fts"]["stop_words"] == ["cat", "dog"]
    # Only a table holding the earlier casefolded form opens with other spellings.
    t = Supertable.create(str(tmp_path / "u"), SCHEMA, fts_columns=["body"],
                          stop_words=["Straße"])
    with pytest.raises(SchemaMismatchError, match="stop_words"):
        Supertable.create(str(tmp_path / "u"), SCHEMA, fts_columns=["body"],
                          stop_words=["strasse"], mode="exist_ok")
    assert Supertable.create(str(tmp_path / "u"), SCHEMA, fts_columns=["body"],
                             stop_words=iter(["STRAßE"]), mode="exist_ok").version == 0
    assert Supertable.create(str(tmp_path / "v"), SCHEMA, stop_words=None).version == 0
