"""One LRU byte budget per Supertable handle: bounded, and never changes an answer."""

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import Supertable
from beam_supertable.format.cache import DEFAULT_CACHE_BYTES, ByteCache
from beam_supertable.format.reader import IOStats, SuperfileReader
from beam_supertable.vector.metric import prepare

D = 16


def test_byte_cache_evicts_least_recently_used_first():
    cache = ByteCache(100)
    for key in "abc":
        cache.put(key, key.upper(), 40)       # "a" goes when "c" arrives
    assert cache.get("a") is None and cache.get("b") == "B" and cache.nbytes == 80
    cache.put("d", "D", 40)                    # "c" is now the least recently used
    assert cache.get("c") is None and cache.get("b") == "B" and cache.get("d") == "D"
    assert cache.put("huge", "H", 101) == "H"  # handed back, not kept
    assert cache.get("huge") is None and cache.nbytes <= 100
    assert cache.get_or_load("e", lambda: ("E", 10)) == "E" and cache.get("e") == "E"
    assert cache.stats()["evictions"] == 2


@pytest.mark.parametrize("bad", [-1, 1.5, "1GB", True])
def test_byte_cache_rejects_a_bad_budget(bad):
    with pytest.raises(ValueError, match="cache_bytes"):
        ByteCache(bad)


def test_byte_cache_is_thread_safe_and_stays_in_budget():
    cache = ByteCache(1000)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(2000):
            key = int(rng.integers(0, 50))
            if cache.get(key) is None:
                cache.put(key, key, int(rng.integers(1, 200)))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert 0 < cache.nbytes <= 1000
    assert len(cache) == cache.stats()["entries"]


@pytest.fixture
def vectors_table(tmp_path):
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(30, D)) * 5
    x = (centers[rng.integers(0, 30, 4000)] + rng.normal(size=(4000, D))).astype(np.float32)
    schema = pa.schema([("n", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D))])
    t = Supertable.create(str(tmp_path / "t"), schema, vector_column="emb", fts_columns=["body"])
    t.append(pa.table({"n": np.arange(4000), "body": [f"w{i % 7} w{i % 11}" for i in range(4000)],
                       "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), D)}),
             n_shards=2)
    t.delete(pc.field("n").isin(np.arange(0, 4000, 5)))
    return str(tmp_path / "t"), x


def test_vectors_beyond_the_budget_load_and_look_up(vectors_table):
    """The reader's vector cache once cleared itself while filling and then raised KeyError."""
    uri, x = vectors_table
    t = Supertable.open(uri)
    entry = max(t.superfiles(), key=lambda e: e["rows"])
    rows_of = t.to_arrow(columns=["_id", "n"])
    cache = ByteCache(8 << 10)   # far less than one superfile's vectors
    reader = SuperfileReader(t.store, entry, IOStats(), cache)
    assert reader.metadata.num_row_groups > 2
    rows = np.arange(reader.num_rows)
    lookup = reader.vectors(rows, "emb", "l2")
    ids = reader.ids()
    n_of = dict(zip(rows_of["_id"].to_pylist(), rows_of["n"].to_pylist()))
    live = np.array([i in n_of for i in ids])
    got = lookup(rows[live])
    want = prepare(x[[n_of[i] for i in ids[live]]], "l2")
    np.testing.assert_array_equal(got, want)
    assert cache.nbytes <= cache.capacity_bytes


@pytest.mark.parametrize("budget", [0, 16 << 10])
def test_a_small_budget_changes_no_answer(vectors_table, budget):
    uri, x = vectors_table
    big = Supertable.open(uri)
    small = Supertable.open(uri, cache_bytes=budget)
    assert big.cache.capacity_bytes == DEFAULT_CACHE_BYTES
    assert small.cache.capacity_bytes == budget
    queries = x[:20] + 0.05
    for _ in range(2):  # the second round runs on what the first one cached
        for kw in ({"vector": queries}, {"vector": queries[0], "filter": pc.field("n") > 100},
                   {"text": "w3 +w5"}, {"vector": queries[1], "text": "w2"}):
            a, b = big.search(k=7, **kw), small.search(k=7, **kw)
            assert a.equals(b), kw
        assert big.to_arrow(filter=pc.field("n") < 50).equals(
            small.to_arrow(filter=pc.field("n") < 50))
        assert small.cache.nbytes <= budget
    assert small.cache.stats()["evictions"] > 0 or budget == 0
    assert small.checkout(small.version).cache.capacity_bytes == budget


def test_the_budget_is_validated_at_open(vectors_table):
    uri, _ = vectors_table
    with pytest.raises(ValueError, match="cache_bytes"):
        Supertable.open(uri, cache_bytes=-5)


def test_vector_search_stores_are_charged_to_the_handle_budget(vectors_table):
    """Decoded codes and fp32 rows a vector search keeps count against the budget."""
    uri, x = vectors_table
    t = Supertable.open(uri)
    queries = x[:50] + 0.05
    first = t.search(vector=queries, k=10, recall_target=1.0, columns=[])  # every cell
    # At least every row's scoring column (dim + 1 floats) is held, and charged.
    assert t.cache.nbytes >= 3200 * (D + 1) * 4
    small = Supertable.open(uri, cache_bytes=64 << 10)
    for _ in range(2):
        assert small.search(vector=queries, k=10, recall_target=1.0, columns=[]).equals(first)
        assert small.cache.nbytes <= 64 << 10


def test_a_warm_search_takes_its_result_columns_from_the_cache(vectors_table):
    """Result columns of row groups read once are kept decoded: a repeated search reads
    nothing from the store and returns what a fresh handle returns."""
    uri, x = vectors_table
    warm = Supertable.open(uri)
    queries = x[:30] + 0.05
    first = warm.search(vector=queries, k=10, columns=["n", "body"])
    read = warm.io.bytes
    again = warm.search(vector=queries, k=10, columns=["n", "body"])
    assert warm.io.bytes == read and again.equals(first)
    assert Supertable.open(uri).search(vector=queries, k=10, columns=["n", "body"]).equals(first)
    entry = warm.superfiles()[0]
    reader = warm._reader(entry)
    rows = np.array([5, 0, 5, reader.num_rows - 1])
    assert reader.take_kept(rows, ["_id", "n", "body"]).equals(
        reader.take(rows, ["_id", "n", "body"]))
