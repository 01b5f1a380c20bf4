"""Beam's RAG framework on a supertable: Chunks in through the writer config,
neighbours out through the Enrichment handler, in real pipelines.

The embedder is deterministic (signed feature hashing of words, unit length),
so the true neighbours of every query are computed here by brute force.
"""

import hashlib
import json
import logging
import os
import pickle
import re
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.ml.rag.types import Chunk, Content, Embedding
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from beam_supertable import SchemaMismatchError, Supertable, WriteToSupertable, rag
from beam_supertable.rag import (
    InvalidQueryError, SupertableSearchEnrichmentHandler, SupertableVectorWriterConfig,
    chunk_schema, migrate_chunk_table)
from beam_upsert import Invalid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

D = 64
TOPICS = {
    "pets": ["the cat sleeps on the warm mat", "a dog chases the cat around the yard",
             "kittens and puppies play together", "the old dog barks at the mailman",
             "feeding the cat fish every morning", "a parrot repeats words in its cage"],
    "finance": ["stock markets fell sharply today", "bond yields rise as inflation grows",
                "the central bank raised interest rates", "investors sold shares of tech firms",
                "a market rally lifted bank stocks", "inflation data surprised the bond market"],
    "space": ["the rocket launched a satellite into orbit", "astronauts repaired the station",
              "a comet passed close to the sun", "the telescope imaged a distant galaxy",
              "mars rovers search for ancient water", "the moon landing inspired a generation"],
}
FIELDS = [pa.field("topic", pa.string()), pa.field("year", pa.int64())]


def embed(text: str) -> list:
    """Words hashed (blake2b: the same in every process) into D signed buckets."""
    v = np.zeros(D)
    for word in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        v[h % D] += 1.0 if (h >> 40) & 1 else -1.0
    n = np.linalg.norm(v)
    return (v / n if n else v).tolist()


def make_chunk(cid, text, embedding=None, **metadata) -> Chunk:
    return Chunk(content=Content(text=text), id=cid, metadata=metadata,
                 embedding=Embedding(dense_embedding=embed(text) if embedding is None
                                     else embedding))


def corpus():
    chunks, i = [], 0
    for topic, texts in TOPICS.items():
        for text in texts:
            chunks.append(make_chunk(f"c{i:02d}", text, topic=topic, year=2000 + i, page=i % 3))
            i += 1
    return chunks


CHUNKS = corpus()
BY_ID = {c.id: c for c in CHUNKS}


def true_neighbours(query_vec, k, where=lambda c: True):
    """(cosine distance, id) of the k nearest chunks passing ``where``."""
    q = np.asarray(query_vec)
    scored = sorted((float(1 - np.dot(q, c.embedding.dense_embedding)), c.id)
                    for c in CHUNKS if where(c))
    return scored[:k]


def assert_true_neighbours(data, query_vec, k, where=lambda c: True):
    """The results are the k nearest (ties in any order) with their true distances."""
    want = true_neighbours(query_vec, k, where)
    np.testing.assert_allclose(data["distance"], [d for d, _ in want], atol=1e-5)
    for cid, d in zip(data["id"], data["distance"]):
        assert where(BY_ID[cid])
        assert abs(true_neighbours(query_vec, 1, lambda c: c.id == cid)[0][0] - d) < 1e-5


def write(uri, chunks=CHUNKS, **config):
    config = SupertableVectorWriterConfig(uri, **config)
    p = TestPipeline()
    result = p | beam.Create(chunks) | config.create_write_transform().with_invalid_output()
    reasons = result.invalid | beam.Map(lambda bad: bad[1])
    p.run().wait_until_finish()
    return result, reasons


@pytest.fixture(scope="module")
def table_uri(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("rag") / "chunks")
    write(uri, dimension=D, metadata_fields=FIELDS)
    return uri


# -- ingestion -------------------------------------------------------------------
def test_chunks_land_as_rows_of_the_chunk_table(table_uri):
    t = Supertable.open(table_uri)
    assert t.user_schema.equals(chunk_schema(D, FIELDS))
    assert t.properties["vector"]["column"] == rag.EMBEDDING_COLUMN
    assert t.properties["vector"]["metric"] == "cosine"
    assert t.properties["fts"]["columns"] == [rag.CONTENT_COLUMN]
    rows = {r["id"]: r for r in t.to_arrow().to_pylist()}
    assert sorted(rows) == sorted(BY_ID)
    for cid, row in rows.items():
        chunk = BY_ID[cid]
        assert row["content"] == chunk.content.text
        assert row["topic"] == chunk.metadata["topic"] and row["year"] == chunk.metadata["year"]
        # Metadata not flattened into columns stays, as JSON.
        assert json.loads(row["metadata"]) == {"page": chunk.metadata["page"]}
        np.testing.assert_allclose(row["embedding"], chunk.embedding.dense_embedding, atol=1e-6)


def test_a_commit_per_write_and_chunks_that_cannot_be_stored_go_to_invalid(tmp_path):
    uri = str(tmp_path / "chunks")
    bad = [
        Chunk(content=Content(text="no embedding"), id="no-emb"),
        make_chunk("short", "too short", embedding=[1.0, 0.0]),
        make_chunk("nan", "not finite", embedding=[float("nan")] * D),
        make_chunk("year", "bad year", year="last year"),
        make_chunk(7, "an int id"),
    ]
    config = SupertableVectorWriterConfig(uri, dimension=D, metadata_fields=FIELDS)
    p = TestPipeline()
    result = (p | beam.Create(CHUNKS[:5] + bad)
              | config.create_write_transform().with_invalid_output())
    assert_that(result.commits | beam.Map(lambda c: (c.version, c.rows)), equal_to([(1, 5)]),
                label="commits")
    assert_that(result.invalid | "Kinds" >> beam.Map(lambda bad: type(bad).__name__),
                equal_to(["Invalid"] * len(bad)), label="kinds")
    reasons = result.invalid | beam.Map(lambda bad: bad[1])
    assert_that(reasons, lambda got: _reasons_name(got, [
        "'no-emb' has no dense embedding", "'short': the embedding has 2 values",
        "'nan': the embedding holds NaN", "'year': metadata 'year'", "id must be a non-empty string"]),
        label="reasons")
    p.run().wait_until_finish()
    assert sorted(Supertable.open(uri).to_arrow(columns=["id"])["id"].to_pylist()) == \
        [c.id for c in CHUNKS[:5]]


def _reasons_name(got, fragments):
    got = sorted(got)
    assert len(got) == len(fragments), got
    for fragment in fragments:
        assert any(fragment in reason for reason in got), (fragment, got)


def test_on_invalid_fail_fails_the_pipeline(tmp_path):
    config = SupertableVectorWriterConfig(str(tmp_path / "t"), dimension=D, on_invalid="fail")
    p = TestPipeline()
    _ = p | beam.Create([make_chunk("short", "x", embedding=[1.0])]) | config.create_write_transform()
    with pytest.raises(Exception, match="'short': the embedding has 1 values"):
        p.run().wait_until_finish()


def test_without_a_dimension_the_first_chunk_decides(tmp_path):
    uri = str(tmp_path / "chunks")
    odd = make_chunk("odd", "odd one", embedding=[0.5] * (D + 1))
    _, reasons = write(uri, CHUNKS[:4] + [odd])
    t = Supertable.open(uri)
    dim = t.properties["vector"]["dim"]
    stored = sorted(t.to_arrow(columns=["id"])["id"].to_pylist())
    # Whichever chunk came first set the dimension; the others of that size landed.
    if dim == D:
        assert stored == [c.id for c in CHUNKS[:4]]
    else:
        assert dim == D + 1 and stored == ["odd"]
    assert t.version == 1 and t.primary_key == ["id"] and t.frontier is not None
    # The next write sees the table and takes the parallel path.
    write(uri, CHUNKS[4:6] if dim == D else [make_chunk("odd2", "x", embedding=[1.0] * (D + 1))])
    assert Supertable.open(uri).count_rows() == len(stored) + (2 if dim == D else 1)


def test_an_existing_table_must_match(tmp_path, table_uri):
    with pytest.raises(SchemaMismatchError, match="dimension=8, but the table .* holds 64"):
        SupertableVectorWriterConfig(table_uri, dimension=8,
                                     metadata_fields=FIELDS).create_write_transform()
    with pytest.raises(SchemaMismatchError, match="not a chunk table"):
        SupertableVectorWriterConfig(table_uri).create_write_transform()  # no metadata fields
    other = str(tmp_path / "other")
    Supertable.create(other, pa.schema([("body", pa.string())]))
    with pytest.raises(SchemaMismatchError, match="not a chunk table"):
        SupertableVectorWriterConfig(other, dimension=D).create_write_transform()


def test_config_validates_while_the_pipeline_is_built():
    with pytest.raises(ValueError, match="dimension must be a positive int"):
        SupertableVectorWriterConfig("memory://x", dimension=0)
    with pytest.raises(ValueError, match="metric must be one of"):
        SupertableVectorWriterConfig("memory://x", metric="hamming")
    with pytest.raises(ValueError, match=r"clash with the chunk columns"):
        SupertableVectorWriterConfig("memory://x", metadata_fields=[pa.field("id", pa.string())])
    with pytest.raises(ValueError, match="on_invalid"):
        SupertableVectorWriterConfig("memory://x", on_invalid="ignore")


def test_the_write_transform_of_beams_rag_package(tmp_path):
    base = pytest.importorskip("apache_beam.ml.rag.ingestion.base",
                               reason="this apache-beam has no RAG ingestion package")
    config = SupertableVectorWriterConfig(str(tmp_path / "t"), dimension=D)
    assert isinstance(config, base.VectorDatabaseWriteConfig)
    with TestPipeline() as p:
        _ = p | beam.Create(CHUNKS) | base.VectorDatabaseWriteTransform(config)
    assert Supertable.open(str(tmp_path / "t")).count_rows() == len(CHUNKS)


# -- re-ingestion: chunks upserted by id ---------------------------------------------
S = 1_000_000  # µs per second


def _row_ids(uri):
    """chunk id -> (row _id, content) of the live rows; fails on a repeated chunk id."""
    rows = Supertable.open(uri).to_arrow(columns=["_id", "id", "content"]).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a chunk id holds more than one row"
    return {r["id"]: (r["_id"], r["content"]) for r in rows}


def _changed(cid, text):
    """Chunk ``cid`` with new text (and so a new embedding), its metadata kept."""
    return make_chunk(cid, text, **BY_ID[cid].metadata)


def test_reingestion_replaces_changed_chunks_and_leaves_the_rest(tmp_path):
    uri = str(tmp_path / "chunks")
    write(uri, dimension=D, metadata_fields=FIELDS)
    first = Supertable.open(uri)
    assert first.primary_key == ["id"] and first.frontier is not None
    before = _row_ids(uri)
    changed = {"c00": "volcanoes erupt molten lava", "c13": "glaciers carve deep valleys"}
    new = make_chunk("c99", "submarines dive under arctic ice", topic="space", year=2030)
    again = [_changed(cid, text) for cid, text in changed.items()] + CHUNKS[2:8] + [new]
    config = SupertableVectorWriterConfig(uri, metadata_fields=FIELDS)
    p = TestPipeline()
    # Timestamps far below the table's frontier: a bounded run is stamped when
    # it runs, so it replaces what the last run wrote whatever the chunks carry.
    result = (p | beam.Create(again) | beam.Map(lambda c: TimestampedValue(c, 1))
              | config.create_write_transform().with_invalid_output())
    assert_that(result.commits | beam.Map(lambda c: c.version), equal_to([first.version + 1]),
                label="one commit")
    assert_that(result.invalid, equal_to([]), label="nothing refused")
    p.run().wait_until_finish()

    after = _row_ids(uri)
    assert sorted(after) == sorted(list(BY_ID) + ["c99"])
    for cid, text in changed.items():
        assert after[cid][1] == text and after[cid][0] != before[cid][0]
    # Resent unchanged and not sent at all: the very same rows.
    assert {cid: after[cid] for cid in before if cid not in changed} == \
        {cid: row for cid, row in before.items() if cid not in changed}
    assert Supertable.open(uri).frontier > first.frontier

    # Neither search finds a replaced chunk's old content.
    old = {BY_ID[cid].content.text for cid in changed}
    everything = len(after)
    for cid in changed:
        text = BY_ID[cid].content.text
        for mode in ("vector", "text", "hybrid"):
            handler = SupertableSearchEnrichmentHandler(uri, mode=mode, k=everything, nprobe=64)
            _, data = handler(make_chunk("q", text))
            contents = {f["content"] for f in data["fields"]}
            assert not contents & old, (mode, contents & old)
        found = Supertable.open(uri).search(
            vector=np.asarray(embed(text)), k=everything, nprobe=64)["content"].to_pylist()
        assert not set(found) & old and len(found) == everything


def test_copies_of_a_chunk_id_in_one_run(tmp_path):
    uri = str(tmp_path / "chunks")
    write(uri, CHUNKS[:3], dimension=D, metadata_fields=FIELDS)
    same = _changed("c00", "the same new text twice")
    differing = [_changed("c01", "one version"), _changed("c01", "another version")]
    result, _ = write(uri, [same, _changed("c00", "the same new text twice")] + differing,
                      metadata_fields=FIELDS)
    rows = _row_ids(uri)
    assert len(rows) == 3
    # Equal copies are one chunk; differing copies are all refused, and the
    # table keeps what it held for the id.
    assert rows["c00"][1] == "the same new text twice"
    assert rows["c01"][1] == BY_ID["c01"].content.text


def test_differing_copies_of_an_id_go_to_the_dead_letters(tmp_path):
    uri = str(tmp_path / "chunks")
    write(uri, CHUNKS[:2], dimension=D)
    config = SupertableVectorWriterConfig(uri)
    p = TestPipeline()
    result = (p | beam.Create([_changed("c01", "one version"), _changed("c01", "another")])
              | config.create_write_transform().with_invalid_output())
    assert_that(result.invalid | beam.Map(lambda bad: (
        type(bad) is Invalid, bad.element["id"], bad.element["content"],
        "appears more than once in this write with different contents" in bad.reason)),
        equal_to([(True, "c01", "one version", True), (True, "c01", "another", True)]))
    p.run().wait_until_finish()
    assert _row_ids(uri)["c01"][1] == BY_ID["c01"].content.text


def _stream(batches):
    """TestStream of ``(seconds, chunks)`` batches, the watermark stepping past each."""
    stream = TestStream()
    for at, chunks in batches:
        stream = stream.add_elements([TimestampedValue(c, at) for c in chunks])
        stream = stream.advance_watermark_to(at + 1)
    return stream.advance_watermark_to_infinity()


def _ingest_stream(uri, batches):
    config = SupertableVectorWriterConfig(uri, dimension=D, metadata_fields=FIELDS)
    p = TestPipeline(options=PipelineOptions(streaming=True))
    result = p | _stream(batches) | config.create_write_transform().with_invalid_output()
    assert_that(result.invalid, equal_to([]), label="nothing refused")
    p.run().wait_until_finish()


def test_unbounded_reingestion_follows_the_streams_timestamps(tmp_path):
    uri = str(tmp_path / "chunks")
    _ingest_stream(uri, [(10, CHUNKS[:4]), (12, CHUNKS[4:6])])
    first = Supertable.open(uri)
    assert first.primary_key == ["id"] and first.frontier >= 12 * S
    before = _row_ids(uri)
    assert sorted(before) == [c.id for c in CHUNKS[:6]]
    new = make_chunk("c99", "submarines dive under arctic ice", topic="space", year=2030)
    _ingest_stream(uri, [
        (5, [_changed("c01", "older than the table's frontier")]),   # applied already
        (20, [_changed("c00", "volcanoes erupt molten lava"), new, CHUNKS[3]]),
        (30, [_changed("c02", "glaciers carve deep valleys")]),
        (31, [_changed("c02", "glaciers carve deeper valleys")]),      # later time wins
    ])
    after = _row_ids(uri)
    assert sorted(after) == sorted([c.id for c in CHUNKS[:6]] + ["c99"])
    assert after["c00"][1] == "volcanoes erupt molten lava"
    assert after["c02"][1] == "glaciers carve deeper valleys"
    assert after["c01"] == before["c01"] and after["c03"] == before["c03"]
    assert after["c04"] == before["c04"] and after["c05"] == before["c05"]
    assert Supertable.open(uri).frontier > 31 * S
    _, data = SupertableSearchEnrichmentHandler(uri, mode="text", k=7)(
        make_chunk("q", "glaciers carve deep valleys"))
    assert [f["content"] for f in data["fields"]][:1] == ["glaciers carve deeper valleys"]


@pytest.mark.slow
def test_an_append_only_chunk_table_is_still_appended_to(tmp_path, caplog):
    uri = str(tmp_path / "legacy")
    write(uri, CHUNKS[:3], dimension=D, upsert=False)
    assert Supertable.open(uri).primary_key == []
    with caplog.at_level(logging.WARNING, logger="beam_supertable.rag.ingestion"):
        write(uri, CHUNKS[:3])
        write(uri, [_changed("c00", "the newest c00")])
    warnings = [r.getMessage() for r in caplog.records if uri in r.getMessage()]
    assert len(warnings) == 1 and "migrate_chunk_table" in warnings[0]
    ids = Supertable.open(uri).to_arrow(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == sorted(["c00", "c01", "c02"] * 2 + ["c00"])

    # The migration: one row per id (the copy written last), in a keyed table
    # that later writes upsert into; the source stays as it was.
    keyed = str(tmp_path / "keyed")
    migrate_chunk_table(uri, keyed)
    assert Supertable.open(keyed).primary_key == ["id"]
    assert {cid: text for cid, (_, text) in _row_ids(keyed).items()} == {
        "c00": "the newest c00", "c01": BY_ID["c01"].content.text,
        "c02": BY_ID["c02"].content.text}
    write(keyed, [_changed("c01", "c01 replaced")])
    assert _row_ids(keyed)["c01"][1] == "c01 replaced" and len(_row_ids(keyed)) == 3
    assert Supertable.open(uri).count_rows() == 7
    with pytest.raises(SchemaMismatchError, match="keyed by"):
        migrate_chunk_table(keyed, str(tmp_path / "again"))


def test_upsert_false_refuses_a_keyed_table(table_uri):
    with pytest.raises(SchemaMismatchError, match="upsert=False, but the table .* is keyed"):
        SupertableVectorWriterConfig(table_uri, metadata_fields=FIELDS,
                                     upsert=False).create_write_transform()
    with pytest.raises(TypeError, match="upsert must be True or False"):
        SupertableVectorWriterConfig(table_uri, upsert="yes")


# -- the handler, called as Enrichment calls it ----------------------------------------
QUERIES = ["a cat and a dog", "bank stocks and bond markets", "a rocket to the moon"]


def _ids(data):
    return data["id"]


def test_vector_search_returns_the_true_neighbours(table_uri):
    handler = SupertableSearchEnrichmentHandler(table_uri, k=4, nprobe=64)
    with handler:
        pairs = handler([make_chunk(f"q{i}", q) for i, q in enumerate(QUERIES)])
    for (request, data), text in zip(pairs, QUERIES):
        assert_true_neighbours(data, embed(text), 4)
        fields = data["fields"]
        assert [f["id"] for f in fields] == data["id"]
        assert set(fields[0]) == {"id", "content", "metadata", "topic", "year", "_distance"}
        assert fields[0]["metadata"] == {"page": BY_ID[fields[0]["id"]].metadata["page"]}


def test_text_search_ranks_the_chunks_with_the_words(table_uri):
    handler = SupertableSearchEnrichmentHandler(table_uri, mode="text", k=3)
    _, data = handler(make_chunk("q", "inflation bond"))
    # Exactly two chunks hold both words; they outrank the ones holding one.
    assert set(data["id"][:2]) == {"c07", "c11"}
    assert data["distance"] == sorted(data["distance"], reverse=True)
    assert all("_score" in f and "_distance" not in f for f in data["fields"])


def test_hybrid_fuses_the_vector_and_text_rankings(table_uri):
    handler = SupertableSearchEnrichmentHandler(table_uri, mode="hybrid", k=3, nprobe=64)
    # The words name one chunk; the vector (of another text) points at another.
    query = make_chunk("q", "telescope galaxy", embedding=embed("rocket satellite orbit"))
    _, data = handler(query)
    assert {"c15", "c12"} <= set(data["id"])
    assert all("_score" in f and "_distance" in f for f in data["fields"])
    _, vector_only = SupertableSearchEnrichmentHandler(table_uri, k=3, nprobe=64)(query)
    assert "c15" not in vector_only["id"]


def test_auto_mode_follows_what_each_request_carries(table_uri):
    handler = SupertableSearchEnrichmentHandler(table_uri, mode="auto", k=2, nprobe=64)
    rows = [beam.Row(id="v", embedding=embed("the cat"), text=None),
            beam.Row(id="t", embedding=None, text="galaxy"),
            beam.Row(id="h", vector=embed("stocks"), content="stocks")]
    (_, v), (_, t), (_, h) = handler(rows)
    assert "_distance" in v.enrichment_data["fields"][0]
    assert t.enrichment_data["id"][0] == "c15" and "_distance" not in t.enrichment_data["fields"][0]
    assert {"_distance", "_score"} <= set(h.enrichment_data["fields"][0])


def test_filter_and_columns(table_uri):
    handler = SupertableSearchEnrichmentHandler(
        table_uri, k=3, nprobe=64, filter=pc.field("topic") == "pets", columns=["content"])
    _, data = handler(make_chunk("q", "the market"))
    assert_true_neighbours(data, embed("the market"), 3, lambda c: c.metadata["topic"] == "pets")
    assert all(set(f) == {"content", "_distance"} for f in data["fields"])


def test_a_filter_per_request_batches_by_filter(table_uri):
    handler = SupertableSearchEnrichmentHandler(
        table_uri, k=2, nprobe=64,
        filter=lambda chunk: pc.field("topic") == chunk.metadata["topic"])
    requests = [make_chunk(f"q{i}", "the market", topic=t)
                for i, t in enumerate(["pets", "space", "pets", "finance"])]
    for request, data in handler(requests):
        assert {BY_ID[i].metadata["topic"] for i in data["id"]} == {request.metadata["topic"]}


def test_requests_that_lack_what_the_mode_needs(table_uri):
    vector = SupertableSearchEnrichmentHandler(table_uri)
    with pytest.raises(InvalidQueryError, match="'q': vector search needs a dense embedding"):
        vector(Chunk(content=Content(text="x"), id="q"))
    with pytest.raises(InvalidQueryError, match="'q': text search needs text"):
        SupertableSearchEnrichmentHandler(table_uri, mode="text")(
            make_chunk("q", "   ", embedding=[0.0] * D))
    with pytest.raises(InvalidQueryError, match="neither an embedding nor text"):
        SupertableSearchEnrichmentHandler(table_uri, mode="auto")(
            beam.Row(id="q", embedding=None, text=None))
    with pytest.raises(ValueError, match="must have 64 values"):
        vector(make_chunk("q", "x", embedding=[1.0, 2.0]))


def test_the_handler_checks_its_settings_and_the_table(table_uri, tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        SupertableSearchEnrichmentHandler(table_uri, mode="keyword")
    with pytest.raises(ValueError, match="k must be a positive int"):
        SupertableSearchEnrichmentHandler(table_uri, k=0)
    with pytest.raises(ValueError, match="min_batch_size"):
        SupertableSearchEnrichmentHandler(table_uri, min_batch_size=5, max_batch_size=2)
    with pytest.raises(SchemaMismatchError, match=r"no column\(s\) \['nope'\]"):
        SupertableSearchEnrichmentHandler(table_uri, columns=["nope"]).__enter__()
    plain = str(tmp_path / "plain")
    Supertable.create(plain, pa.schema([("body", pa.string())]), fts_columns=["body"])
    with pytest.raises(rag.SupertableError, match="no vector index for mode='vector'"):
        SupertableSearchEnrichmentHandler(plain).__enter__()


def test_cache_key_is_the_query_not_the_request(table_uri):
    handler = SupertableSearchEnrichmentHandler(table_uri, mode="auto")
    a, b = make_chunk("a", "the cat"), make_chunk("b", "the cat")
    assert handler.get_cache_key(a) == handler.get_cache_key(b)
    assert handler.get_cache_key(a) != handler.get_cache_key(make_chunk("a", "the dog"))
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 1000}


def test_refresh_policy(tmp_path):
    uri = str(tmp_path / "chunks")
    write(uri, CHUNKS[:6], dimension=D)
    pinned = SupertableSearchEnrichmentHandler(uri, mode="text", k=5, version=1).__enter__()
    never = SupertableSearchEnrichmentHandler(uri, mode="text", k=5,
                                              refresh_every_s=None).__enter__()
    always = SupertableSearchEnrichmentHandler(uri, mode="text", k=5,
                                               refresh_every_s=0).__enter__()
    write(uri, [make_chunk("new", "a brand new galaxy")], dimension=D)
    query = make_chunk("q", "galaxy")
    assert pinned(query)[1]["id"] == [] and never(query)[1]["id"] == []
    assert always(query)[1]["id"] == ["new"]


def test_the_handler_pickles_before_and_after_enter(table_uri):
    handler = SupertableSearchEnrichmentHandler(table_uri, k=2, filter=pc.field("year") > 2005)
    with handler:
        copy = pickle.loads(pickle.dumps(handler))
    query = make_chunk("q", "the cat")
    assert copy(query)[1] == handler(query)[1]


# -- through Beam's Enrichment ---------------------------------------------------------
def _enrichment():
    if rag.Enrichment is None:
        pytest.skip(f"Beam's Enrichment does not import here: {rag.ENRICHMENT_IMPORT_ERROR}")
    return rag.Enrichment


def _neighbour_ids(chunk):
    return chunk.id, chunk.metadata[rag.ENRICHMENT_KEY]["id"]


@pytest.mark.parametrize("batch", [1, 50])
def test_chunks_write_then_enrichment_retrieves_the_neighbours(tmp_path, batch):
    Enrichment = _enrichment()
    uri = str(tmp_path / "chunks")
    write(uri, dimension=D, metadata_fields=FIELDS)
    queries = [make_chunk(f"q{i}", q, asked_by="test") for i, q in enumerate(QUERIES)]
    handler = SupertableSearchEnrichmentHandler(uri, k=3, nprobe=64, min_batch_size=batch,
                                                max_batch_size=batch)

    def the_true_neighbours(got):
        assert sorted(c.id for c in got) == ["q0", "q1", "q2"]
        for chunk in got:
            assert_true_neighbours(chunk.metadata[rag.ENRICHMENT_KEY], embed(chunk.content.text), 3)

    with TestPipeline() as p:
        out = p | beam.Create(queries) | Enrichment(handler, join_fn=handler.join_fn)
        assert_that(out, the_true_neighbours, label="neighbours")
        # The request's own metadata stays; the results join it.
        assert_that(out | beam.Map(lambda c: sorted(c.metadata)),
                    equal_to([["asked_by", rag.ENRICHMENT_KEY]] * 3), label="metadata")


def test_enrichment_takes_the_handlers_join_where_beam_supports_it(table_uri):
    Enrichment = _enrichment()
    if not rag._ENRICHMENT_TAKES_HANDLER_JOIN:
        pytest.skip("this apache-beam's Enrichment ignores a handler's join_fn")
    handler = SupertableSearchEnrichmentHandler(table_uri, mode="text", k=1)
    with TestPipeline() as p:
        out = p | beam.Create([make_chunk("q", "galaxy")]) | Enrichment(handler)
        assert_that(out | beam.Map(_neighbour_ids), equal_to([("q", ["c15"])]))


def test_enrichment_of_rows(table_uri):
    Enrichment = _enrichment()
    handler = SupertableSearchEnrichmentHandler(table_uri, mode="auto", k=1, nprobe=64)
    with TestPipeline() as p:
        out = (p | beam.Create([("t", "galaxy")])
               | beam.Map(lambda q: beam.Row(id=q[0], text=q[1]))
               | Enrichment(handler, join_fn=handler.join_fn)
               | beam.Map(lambda row: (row.id, row.text, row.enrichment_data["id"])))
        assert_that(out, equal_to([("t", "galaxy", ["c15"])]))


def test_write_to_supertable_then_search_any_table(tmp_path):
    # The handler searches tables that were not written as chunk tables too.
    uri = str(tmp_path / "docs")
    schema = pa.schema([("title", pa.string()), ("vec", pa.list_(pa.float32(), D))])
    with TestPipeline() as p:
        _ = (p | beam.Create([{"title": c.content.text, "vec": c.embedding.dense_embedding}
                              for c in CHUNKS])
             | WriteToSupertable(uri, schema=schema, vector_column="vec", metric="cosine",
                                 fts_columns=["title"]))
    _, data = SupertableSearchEnrichmentHandler(uri, mode="text", k=1)(make_chunk("q", "galaxy"))
    assert data["fields"][0]["title"] == BY_ID["c15"].content.text
    assert isinstance(data["id"][0], int)  # the row's _id: the table has no id column


def _run_example(table, cwd, *how):
    """The example in a process of its own: ``how`` is ``("-m",)`` or ``()`` (a script)."""
    target = ["-m", "examples.rag_pipeline"] if how else [
        os.path.join(ROOT, "examples", "rag_pipeline.py")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # it finds its repo
    return subprocess.run([sys.executable, *target, "--table", table], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


def _answers(stdout):
    answers = {}
    for line in stdout.splitlines():
        if line.startswith("Q: "):
            question = line[3:]
            answers[question] = []
        elif line.startswith("   - "):
            answers[question].append(line[5:])
    return answers


@pytest.mark.slow
def test_the_example_runs_as_a_script_and_a_rerun_replaces_its_chunks(tmp_path):
    table = str(tmp_path / "rag_chunks")
    done = _run_example(table, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    answers = _answers(done.stdout)
    assert answers["what pulls the oceans"][0] == \
        "Tides rise and fall because the moon pulls on the oceans."
    assert answers["how do kittens learn to hunt"][0] == \
        "Kittens learn to hunt by playing with their siblings."
    assert "Bread dough rises because yeast makes gas." in answers["why does bread dough rise"]
    assert Supertable.open(table).count_rows() == 11
    rows = _row_ids(table)
    assert os.listdir(tmp_path) == ["rag_chunks"]   # its answers file went with its run

    again = _run_example(table, ROOT, "-m")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _answers(again.stdout) == answers
    assert _row_ids(table) == rows   # one row per chunk id, the same rows


@pytest.mark.parametrize("what", ["a directory with a file", "a file", "another table"])
def test_the_example_refuses_a_table_path_that_holds_something_else(tmp_path, what):
    target = tmp_path / "target"
    if what == "a directory with a file":
        target.mkdir()
        (target / "notes.txt").write_text("keep me")
    elif what == "a file":
        target.write_text("keep me")
    else:
        Supertable.create(str(target), pa.schema([("body", pa.string())]))
    before = sorted((str(p.relative_to(tmp_path)), p.read_bytes() if p.is_file() else None)
                    for p in tmp_path.rglob("*"))
    done = _run_example(str(target), ROOT, "-m")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and str(target) in lines[0], done.stderr
    assert ("another schema" if what == "another table" else "not a supertable") in lines[0]
    assert done.stdout == ""
    assert sorted((str(p.relative_to(tmp_path)), p.read_bytes() if p.is_file() else None)
                  for p in tmp_path.rglob("*")) == before
