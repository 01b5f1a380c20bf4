"""Keyed tables: the primary key, upsert, keyed append, deletes resolved on the latest
version, the frontier."""

import datetime
import os
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import (
    DuplicateKeyError, FrontierError, ReadFromSupertable, SchemaMismatchError, Supertable,
    TokenReuseError, UpsertToSupertable)

D = 8
SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D))])


def _vectors(ids, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(len(ids), D)).astype(np.float32)


def _rows(ids, tag, seed=0):
    ids = list(ids)
    x = _vectors(ids, seed)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "body": [f"{tag} word{i}" for i in ids],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), D),
    }), x


def _live(t, key="id", value="body"):
    rows = t.to_arrow(columns=[key, value]).to_pylist()
    keys = [r[key] for r in rows]
    assert len(keys) == len(set(keys)), "two live rows for one key"
    return {r[key]: r[value] for r in rows}


def _memory_uri():
    return f"memory://keyed/{uuid.uuid4().hex}"


def _data_objects(t):
    return {o.path for o in t.store.list("data")}


# -- create ---------------------------------------------------------------------
def test_create_records_and_validates_the_primary_key():
    t = Supertable.create(_memory_uri(), SCHEMA, primary_key="id")
    assert t.primary_key == ["id"]
    assert not t.schema.field("id").nullable           # key columns are non-null
    assert Supertable.open(t.uri).primary_key == ["id"]
    assert Supertable.create(_memory_uri(), SCHEMA, primary_key=["id", "body"]).primary_key == \
        ["id", "body"]
    assert Supertable.create(_memory_uri(), SCHEMA).primary_key == []
    with pytest.raises(SchemaMismatchError, match="'nope' is not in the schema"):
        Supertable.create(_memory_uri(), SCHEMA, primary_key="nope")
    with pytest.raises(SchemaMismatchError, match="'emb' has type fixed_size_list"):
        Supertable.create(_memory_uri(), SCHEMA, primary_key="emb")
    with pytest.raises(SchemaMismatchError, match="'f' has type double"):
        Supertable.create(_memory_uri(), pa.schema([("f", pa.float64())]), primary_key="f")
    with pytest.raises(SchemaMismatchError, match="more than once"):
        Supertable.create(_memory_uri(), SCHEMA, primary_key=["id", "id"])


@pytest.mark.parametrize("key", [5, b"id", {"id"}])
def test_a_primary_key_that_is_no_name_or_list_is_a_clear_error(tmp_path, key):
    """``primary_key=5`` raised "TypeError: 'int' object is not iterable"; bytes
    were split into numbers; a set has no column order."""
    schema = pa.schema([("id", pa.int64())])
    with pytest.raises(SchemaMismatchError, match=r"primary_key must be a column name"):
        Supertable.create(str(tmp_path / "t"), schema, primary_key=key)
    with pytest.raises(SchemaMismatchError, match=r"primary_key must be a column name"):
        UpsertToSupertable(str(tmp_path / "u"), schema=schema, primary_key=key)
    assert not os.path.exists(tmp_path / "t")

# -- upsert ---------------------------------------------------------------------
def test_upsert_replaces_rows_in_reads_and_search_and_keeps_old_versions(table_location):
    uri, options = table_location
    t = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                          primary_key="id", storage_options=options)
    old, x_old = _rows(range(200), "old", seed=1)
    v1 = t.append(old)
    new, x_new = _rows(range(150, 250), "new", seed=2)
    v2 = t.upsert(new)
    assert v2 == v1 + 1 and t.history()[-1]["operation"] == "upsert"
    t = Supertable.open(uri, storage_options=options)
    live = _live(t)
    assert sorted(live) == list(range(250)) and t.count_rows() == 250
    assert all(live[i] == f"{'old' if i < 150 else 'new'} word{i}" for i in range(250))
    # Text: the replaced rows' words are gone.
    texts = t.search(text="old", k=300, columns=["id"])["id"].to_pylist()
    assert sorted(texts) == list(range(150))
    # Vectors: a replaced row's old vector no longer finds it (it was at distance 0).
    probe = t.search(vector=x_old[160], k=5, nprobe=10_000, columns=["id", "body"])
    assert probe["_distance"][0].as_py() > 1e-3
    assert all(not b.startswith("old") or i < 150
               for i, b in zip(probe["id"].to_pylist(), probe["body"].to_pylist()))
    assert t.search(vector=x_new[10], k=1, nprobe=10_000, columns=["body"])["body"][0].as_py() \
        == "new word160"
    # The old version still reads (and searches) its own rows.
    before = t.checkout(v1)
    assert before.count_rows() == 200 and set(_live(before).values()) == \
        {f"old word{i}" for i in range(200)}
    assert before.search(vector=x_old[160], k=1, nprobe=10_000, columns=["id"])["id"][0].as_py() \
        == 160


def test_read_from_supertable_does_not_see_replaced_rows(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="id")
    t.append(_rows(range(10), "old")[0])
    t.upsert(_rows(range(5, 15), "new")[0])
    expected = [(i, f"{'old' if i < 5 else 'new'} word{i}") for i in range(15)]
    with TestPipeline() as p:
        rows = (p | ReadFromSupertable(uri, columns=["id", "body"])
                | beam.Map(lambda r: (r["id"], r["body"])))
        assert_that(rows, equal_to(expected))


KEY_TYPES = [
    ("int8", [pa.field("k", pa.int8())], lambda i: {"k": i - 20}),
    ("uint64", [pa.field("k", pa.uint64())], lambda i: {"k": 2 ** 64 - 1 - i}),
    ("string", [pa.field("k", pa.string())], lambda i: {"k": f"key-{i:03d}" if i else ""}),
    ("large_string", [pa.field("k", pa.large_string())],
     lambda i: {"k": "é" * (i % 5) + str(i)}),
    ("binary", [pa.field("k", pa.binary())],
     lambda i: {"k": bytes([i % 7]) * (i % 4 + 1) + bytes([i])}),
    ("fixed_binary", [pa.field("k", pa.binary(2))], lambda i: {"k": bytes([i, 255 - i])}),
    ("date", [pa.field("k", pa.date32())],
     lambda i: {"k": datetime.date(2020, 1, 1) + datetime.timedelta(days=i)}),
    ("timestamp", [pa.field("k", pa.timestamp("us", tz="UTC"))],
     lambda i: {"k": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
                + datetime.timedelta(microseconds=i)}),
    ("bool+int", [pa.field("flag", pa.bool_()), pa.field("n", pa.int32())],
     lambda i: {"flag": i % 2 == 0, "n": i // 2}),
    ("string+date", [pa.field("s", pa.string()), pa.field("d", pa.date32())],
     lambda i: {"s": "ab"[i % 2],
                "d": datetime.date(2021, 5, 1) + datetime.timedelta(days=i // 2)}),
]


@pytest.mark.parametrize("indexed", [False, True], ids=["plain", "text-indexed"])
@pytest.mark.parametrize("name,key_fields,key_of", KEY_TYPES, ids=[k[0] for k in KEY_TYPES])
def test_upsert_by_every_key_type(name, key_fields, key_of, indexed):
    # A text index gives superfiles a key section; plain ones are read by projection.
    schema = pa.schema(key_fields + [pa.field("v", pa.string())])
    names = [f.name for f in key_fields]
    t = Supertable.create(_memory_uri(), schema, primary_key=names,
                          fts_columns=["v"] if indexed else ())

    def batch(keys, tag):
        rows = [{**key_of(i), "v": f"{tag}{i}"} for i in keys]
        return pa.Table.from_pylist(rows, schema=schema)

    t.append(batch(range(0, 40), "a"))
    t.append(batch(range(40, 60), "b"))
    t.upsert(batch(range(30, 50), "c"))
    t.upsert(batch(list(range(45, 70)) + [5], "d"))
    expected = {i: "a" for i in range(30)}
    expected.update({i: "c" for i in range(30, 45)})
    expected.update({i: "d" for i in list(range(45, 70)) + [5]})
    got = t.to_arrow(columns=names + ["v"]).to_pylist()
    assert t.count_rows() == len(got) == len(expected)
    seen = {}
    for row in got:
        i = int(row["v"][1:])
        assert {n: row[n] for n in names} == key_of(i)
        seen[i] = row["v"][0]
    assert seen == expected
    if indexed:
        assert all("section" in e["keys"] for e in t.superfiles())


def test_duplicate_keys_in_one_call_name_the_key_and_write_nothing(table_location):
    uri, options = table_location
    t = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    t.append(_rows(range(3), "a")[0])
    before = _data_objects(t)
    with pytest.raises(DuplicateKeyError, match=r"key id=7 appears 2 times .*rows 1, 3") as info:
        t.upsert(_rows([1, 7, 8, 7], "b")[0])
    assert isinstance(info.value, ValueError)
    with pytest.raises(DuplicateKeyError, match="key id=2 appears 2 times in this append"):
        t.append(_rows([2, 2], "b")[0])
    composite = pa.schema([("a", pa.int64()), ("b", pa.string())])
    c = Supertable.create(_memory_uri(), composite, primary_key=["a", "b"])
    with pytest.raises(DuplicateKeyError, match=r"key \(a=1, b='x'\) appears 2 times"):
        c.upsert(pa.table({"a": [1, 1, 1], "b": ["x", "y", "x"]}))
    with pytest.raises(SchemaMismatchError, match="'id' is not nullable but row 1 is null"):
        t.upsert(pa.table({"id": [9, None], "body": ["x", "y"]}))
    assert t.refresh().version == 1 and _data_objects(t) == before
    assert _live(t) == {i: f"a word{i}" for i in range(3)}


def test_upsert_needs_a_keyed_table():
    t = Supertable.create(_memory_uri(), SCHEMA)
    with pytest.raises(SchemaMismatchError, match="no primary key"):
        t.upsert(_rows([1], "a")[0])


def test_keyed_append_refuses_live_keys_even_ones_committed_after_the_handle_opened(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="id")
    t.append(_rows(range(10), "a")[0])
    before = _data_objects(t)
    with pytest.raises(DuplicateKeyError, match=r"key id=5 is already in the table.*upsert"):
        t.append(_rows(range(5, 15), "b")[0])
    assert t.refresh().version == 1 and _data_objects(t) == before  # refused before uploading
    stale, other = Supertable.open(uri), Supertable.open(uri)
    other.append(_rows([100], "other")[0])
    with pytest.raises(DuplicateKeyError, match="key id=100 is already in the table"):
        stale.append(_rows([100, 101], "stale")[0])
    t = Supertable.open(uri)
    assert t.version == 2 and _live(t)[100] == "other word100" and t.count_rows() == 11
    assert t.upsert(pa.table({"id": pa.array([], pa.int64())})) == 2   # nothing: no commit


def test_a_stale_handle_resolves_its_keys_on_the_winners_version(table_location):
    uri, options = table_location
    Supertable.create(uri, SCHEMA, vector_column="emb", primary_key="id", storage_options=options)
    first = Supertable.open(uri, storage_options=options)
    second = Supertable.open(uri, storage_options=options)
    first.upsert(_rows([1, 2], "first")[0])
    second.upsert(_rows([2, 3], "second")[0])   # read version 0, lands on top of first's rows
    t = Supertable.open(uri, storage_options=options)
    assert _live(t) == {1: "first word1", 2: "second word2", 3: "second word3"}
    assert t.count_rows() == 3


# -- deletes resolved against the latest version ---------------------------------------
def test_delete_also_removes_matching_rows_committed_after_the_handle_opened(table_location):
    uri, options = table_location
    schema = pa.schema([("year", pa.int64())])
    Supertable.create(uri, schema, storage_options=options).append(pa.table({"year": [1990, 2010]}))
    deleter = Supertable.open(uri, storage_options=options)
    Supertable.open(uri, storage_options=options).append(pa.table({"year": [2020, 1980]}))
    deleter.delete(pc.field("year") >= 2000)
    t = Supertable.open(uri, storage_options=options)
    assert sorted(t.to_arrow(columns=["year"])["year"].to_pylist()) == [1980, 1990]
    assert t.count_rows() == 2


def test_concurrent_deletes_of_the_same_rows_merge_instead_of_conflicting(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, primary_key="id").append(_rows(range(10), "a")[0])
    first, second = Supertable.open(uri), Supertable.open(uri)
    first.delete(pc.field("id").isin([1, 2]))
    second.delete(pc.field("id").isin([2, 3]))     # same superfile, one row in common
    t = Supertable.open(uri)
    assert sorted(_live(t)) == [0, 4, 5, 6, 7, 8, 9]
    assert t.count_rows() == 7                        # row 2 is counted once
    assert len(t.snapshot.deletes[t.superfiles()[0]["id"]]) == 2


# -- frontier ----------------------------------------------------------------------
def test_frontier_only_moves_forward_and_is_carried_by_other_commits(table_location):
    uri, options = table_location
    t = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    assert t.frontier is None
    t.append(_rows([1, 2], "a")[0], frontier=100)
    assert t.frontier == 100
    t.append(_rows([3], "a")[0])                                   # carried forward
    t.upsert(_rows([1], "b")[0], frontier=150)
    t.delete(pc.field("id") == 3)
    assert Supertable.open(uri, storage_options=options).frontier == 150
    version = t.version
    assert t.delete(pc.field("id") == 99, frontier=150) == version  # nothing to do
    assert t.delete(pc.field("id") == 99, frontier=200) == version + 1  # records the frontier
    assert t.upsert(_rows([], "c")[0], frontier=250) == version + 2
    assert t.frontier == 250 and t.snapshot.properties["frontier"] == 250
    with pytest.raises(FrontierError, match="frontier 120 is lower than the table's frontier 250") \
            as info:
        t.upsert(_rows([5], "c")[0], frontier=120)
    assert isinstance(info.value, ValueError)
    with pytest.raises(TypeError, match="frontier must be an int"):
        t.append(_rows([5], "c")[0], frontier=1.5)
    # A stale handle learns of the higher frontier only when it commits.
    stale = Supertable.open(uri, storage_options=options)
    Supertable.open(uri, storage_options=options).append(_rows([7], "d")[0], frontier=300)
    with pytest.raises(FrontierError, match="frontier 260 is lower than the table's frontier 300"):
        stale.upsert(_rows([8], "e")[0], frontier=260)
    t = Supertable.open(uri, storage_options=options)
    assert t.frontier == 300 and 8 not in _live(t)
    frontiers = [h["metadata"].get("frontier") for h in t.history()]
    assert frontiers == [None, 100, None, 150, None, 200, 250, 300]


# -- lookups read key columns of candidate superfiles only ------------------------------
def _ranged_table(uri, schema, batches, **kwargs):
    t = Supertable.create(uri, schema, primary_key="id", **kwargs)
    for batch in batches:
        t.append(batch)
    return Supertable.open(uri)   # a cold handle: nothing read yet


def test_upsert_reads_only_the_key_section_of_superfiles_that_may_hold_the_keys(tmp_path):
    dim = 32
    schema = pa.schema([("id", pa.int64()), ("body", pa.string()),
                        ("emb", pa.list_(pa.float32(), dim))])
    rng = np.random.default_rng(0)

    def rows(ids):
        x = rng.normal(size=(len(ids), dim)).astype(np.float32)
        return pa.table({"id": pa.array(ids, pa.int64()), "body": [f"text {i}" for i in ids],
                         "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim)})

    t = _ranged_table(str(tmp_path / "t"), schema,
                      [rows(np.arange(b * 2000, (b + 1) * 2000)) for b in range(6)],
                      vector_column="emb", fts_columns=["body"])
    holder = next(e for e in t.superfiles() if e["keys"]["min"] == [2000])
    t.upsert(rows(np.array([2500, 2600, 100_000])))
    # One ranged read: the key section of the one superfile whose range holds
    # 2500 and 2600; nothing of any vector, text or other superfile.
    assert t.io.snapshot() == {"bytes": holder["keys"]["section"][1], "requests": 1}
    assert holder["keys"]["section"][1] < holder["bytes"] / 50
    assert sorted(_live(t, value="id")) == list(range(12_000)) + [100_000]


def test_projected_key_reads_without_a_key_section_and_bloom_pruning(tmp_path):
    # No index sections: the key column is read by a projected Parquet read.
    # String keys: every superfile's range holds the probes, so only the
    # bloom filters rule the other superfiles out (about 1 % false positives
    # each: keys[4000] is one for the second superfile; keys[4001] is none).
    schema = pa.schema([("id", pa.string()), ("payload", pa.string())])
    rng = np.random.default_rng(1)
    keys = [uuid.UUID(int=int(i)).hex for i in rng.integers(0, 2**62, 4002)]
    payload = [rng.bytes(250).hex() for _ in range(1000)]     # incompressible, 500 B a row
    batches = [pa.table({"id": keys[b:4000:4], "payload": payload}) for b in range(4)]
    t = _ranged_table(str(tmp_path / "t"), schema, batches)
    probe, fresh = keys[2], keys[4001]
    entries = t.superfiles()
    for e in entries:
        assert e["keys"]["min"][0] < min(probe, fresh) and max(probe, fresh) < e["keys"]["max"][0]
        assert "section" not in e["keys"]
    holder = next(e for e in entries if e["keys"]["min"] == [min(keys[2:4000:4])])
    t.upsert(pa.table({"id": [probe, fresh], "payload": ["new", "new"]}))
    meta = pq.read_metadata(str(tmp_path / "t" / holder["path"]))
    key_chunks = sum(meta.row_group(g).column(1).total_compressed_size
                     for g in range(meta.num_row_groups))
    # pyarrow opens a file with one speculative 64 KiB read of its tail.
    footer = max(min(holder["bytes"], 64 << 10), meta.serialized_size + 8)
    assert key_chunks < t.io.bytes <= footer + key_chunks < holder["bytes"] / 2
    live = _live(t, value="payload")
    assert len(live) == 4001 and live[probe] == live[fresh] == "new"


# -- a reference model ----------------------------------------------------------------
KEYS = [(a, b) for a in range(4) for b in ("x", "y")]
OPS = st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.dictionaries(st.sampled_from(KEYS), st.integers(0, 99),
                                                 max_size=5)),
    st.tuples(st.just("append"), st.dictionaries(st.sampled_from(KEYS), st.integers(0, 99),
                                                 min_size=1, max_size=3)),
    st.tuples(st.just("delete"), st.sets(st.integers(0, 3), min_size=1, max_size=2)),
), min_size=1, max_size=8)
MODEL_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64())])


def _model_rows(rows):
    return pa.table({"a": [k[0] for k in rows], "b": [k[1] for k in rows],
                     "v": list(rows.values())}, schema=MODEL_SCHEMA)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_keyed_table_matches_a_dict_model_at_every_version(ops):
    t = Supertable.create(_memory_uri(), MODEL_SCHEMA, primary_key=["a", "b"])
    model, versions = {}, [(0, {})]
    for op, arg in ops:
        if op == "upsert":
            t.upsert(_model_rows(arg))
            model.update(arg)
        elif op == "append":
            if set(arg) & set(model):
                with pytest.raises(DuplicateKeyError):
                    t.append(_model_rows(arg))
            else:
                t.append(_model_rows(arg))
                model.update(arg)
        else:
            t.delete(pc.field("a").isin(sorted(arg)))
            model = {k: v for k, v in model.items() if k[0] not in arg}
        versions.append((t.version, dict(model)))
    for version, expected in versions:
        old = t.checkout(version)
        rows = old.to_arrow(columns=["a", "b", "v"]).to_pylist()
        got = {(r["a"], r["b"]): r["v"] for r in rows}
        assert len(got) == len(rows) == old.count_rows()
        assert got == expected


def test_rows_may_be_given_as_dicts():
    schema = pa.schema([("id", pa.int8()), ("d", pa.date32()), ("v", pa.string())])
    t = Supertable.create(_memory_uri(), schema, primary_key="id")
    t.append([{"id": 1, "d": datetime.date(2020, 1, 1)}, {"id": 2, "v": "x"}])
    t.upsert([{"id": 2, "v": "y"}, {"id": 3, "v": "z"}])
    assert sorted(t.to_arrow(columns=["id", "d", "v"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "d": datetime.date(2020, 1, 1), "v": None},
        {"id": 2, "d": None, "v": "y"}, {"id": 3, "d": None, "v": "z"}]
    with pytest.raises(SchemaMismatchError, match="row dicts do not make a table"):
        t.upsert([{"id": 4, "v": "a"}, {"id": 5, "v": 7}])
    with pytest.raises(TypeError, match="got int"):
        t.upsert([{"id": 4}, 5])


def test_a_retried_write_whose_token_landed_returns_its_version(tmp_path):
    # The token is looked for before keys and frontier are checked: a retry
    # finds its own keys live and the frontier moved on by later commits.
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="id")
    v1 = t.append(_rows([1, 2], "a")[0], token="batch-1", frontier=10)
    v2 = t.upsert(_rows([2, 3], "b")[0], token="batch-2", frontier=20)
    v3 = t.delete(pc.field("id") == 1, token="batch-3", frontier=30)
    retry = Supertable.open(uri)
    assert retry.append(_rows([1, 2], "a")[0], token="batch-1", frontier=10) == v1
    assert retry.upsert(_rows([2, 3], "b")[0], token="batch-2", frontier=20) == v2
    with pytest.raises(TokenReuseError):  # the same token over other rows is not a retry
        retry.upsert(_rows([2, 3], "c")[0], token="batch-2", frontier=20)
    assert retry.delete(pc.field("id") == 1, token="batch-3", frontier=30) == v3
    with pytest.raises(TokenReuseError):  # another filter under the token is not a retry
        retry.delete(pc.field("id") == 2, token="batch-3", frontier=30)
    t = Supertable.open(uri)
    assert t.version == v3 and _live(t) == {2: "b word2", 3: "b word3"} and t.frontier == 30
