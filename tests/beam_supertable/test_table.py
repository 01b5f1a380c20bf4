"""The Supertable API: append, read, vector/text/hybrid search, delete, bad input."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import MemoryBudgetError, SchemaMismatchError, Supertable, SupertableError
from beam_supertable.vector.metric import nearest, prepare

D = 16


def _data(n, seed=0, clusters=24):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, D)) * 4
    x = (centers[rng.integers(0, clusters, n)] + rng.normal(size=(n, D))).astype(np.float32)
    return pa.table({
        "year": rng.integers(1990, 2025, n),
        "body": [f"doc {i} {'alpha' if i % 3 == 0 else 'beta'}" for i in range(n)],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), D),
    }), x


SCHEMA = _data(1)[0].schema


@pytest.fixture
def loaded(table_location):
    uri, options = table_location
    data, x = _data(6000)
    t = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                          storage_options=options)
    t.append(data.slice(0, 4000))
    t.append(data.slice(4000))
    return Supertable.open(uri, storage_options=options), data, x


def _recall(t, x, queries, k=10, metric="l2", **kw):
    ids = t.to_arrow(columns=["_id", "emb"])
    pos = {i: j for j, i in enumerate(ids["_id"].to_pylist())}
    emb = np.asarray(ids["emb"].combine_chunks().flatten().to_numpy(), np.float32).reshape(-1, D)
    truth = nearest(prepare(queries, metric), prepare(emb, metric), metric, k)
    got = t.search(vector=queries, k=k, **kw)
    hits = 0
    for qi in range(len(queries)):
        rows = {pos[i] for i in got.filter(pc.field("_query") == qi)["_id"].to_pylist()}
        hits += len(rows & set(truth[qi].tolist()))
    return hits / (k * len(queries))


def test_round_trip_ids_unique_and_stable(loaded):
    t, data, _ = loaded
    rows = t.to_arrow()
    assert rows.num_rows == 6000 == t.count_rows()
    assert len(set(rows["_id"].to_pylist())) == 6000
    assert sorted(rows["year"].to_pylist()) == sorted(data["year"].to_pylist())
    again = Supertable.open(t.uri, storage_options=t.store.storage_options).to_arrow()
    assert again["_id"].to_pylist() == rows["_id"].to_pylist()
    assert t.count_rows(pc.field("year") >= 2000) == pc.sum(pc.greater_equal(data["year"], 2000)).as_py()


def test_vector_search_recall_and_shapes(loaded):
    t, _, x = loaded
    queries = x[:40] + 0.1
    assert _recall(t, x, queries) >= 0.95
    one = t.search(vector=queries[0], k=5)
    assert one.column_names == ["_id", "year", "body", "emb", "_distance"]
    assert one.num_rows == 5
    d = one["_distance"].to_pylist()
    assert d == sorted(d)
    batch = t.search(vector=queries[:3], k=4, columns=["year"])
    assert batch.column_names == ["_id", "year", "_distance", "_query"]
    assert batch["_query"].to_pylist() == [0] * 4 + [1] * 4 + [2] * 4


def test_filtered_search_returns_only_matching_rows(loaded):
    t, _, x = loaded
    got = t.search(vector=x[0], k=10, filter=pc.field("year") > 2020)
    assert got.num_rows == 10
    assert all(y > 2020 for y in got["year"].to_pylist())
    # A very selective filter widens the probe rather than return too little.
    rare = t.search(vector=x[0], k=3, filter=pc.field("year") == 1990)
    assert rare.num_rows == 3 and set(rare["year"].to_pylist()) == {1990}


@pytest.mark.parametrize("metric", ["cosine", "dot"])
def test_other_metrics(tmp_path, metric):
    data, x = _data(3000, seed=1)
    t = Supertable.create(str(tmp_path / "t"), SCHEMA, vector_column="emb", metric=metric)
    t.append(data)
    assert _recall(t, x, x[:30] * 1.01, metric=metric) >= 0.9


def test_text_and_hybrid_search(loaded):
    t, _, x = loaded
    text = t.search(text="alpha doc", k=5)
    assert text.num_rows == 5 and "_score" in text.column_names
    assert all("alpha" in b for b in text["body"].to_pylist())
    hybrid = t.search(vector=x[0], text="alpha", k=5)
    assert {"_distance", "_score"} <= set(hybrid.column_names)
    scores = hybrid["_score"].to_pylist()
    assert scores == sorted(scores, reverse=True)


def test_deletes_hide_rows_from_reads_and_search(loaded):
    t, _, x = loaded
    first = t.search(vector=x[0], k=1)["_id"][0].as_py()
    t.delete(pc.field("_id") == first)
    assert t.count_rows() == 5999 and t.to_arrow().num_rows == 5999
    assert first not in t.search(vector=x[0], k=10)["_id"].to_pylist()
    assert t.history()[-1]["operation"] == "delete"


def test_replicas_are_vector_only(tmp_path):
    data, x = _data(3000, seed=2)
    t = Supertable.create(str(tmp_path / "t"), SCHEMA, vector_column="emb", n_cells=30,
                          replica_factor=0.2)
    t.append(data)
    assert t.to_arrow().num_rows == 3000
    assert sum(len(e["replica_cells"]) for e in t.superfiles()) > 0
    got = t.search(vector=x[:20], k=10)
    for qi in range(20):
        ids = got.filter(pc.field("_query") == qi)["_id"].to_pylist()
        assert len(ids) == len(set(ids)) == 10


def test_grid_is_stamped_once_and_reused(tmp_path):
    data, _ = _data(2000)
    t = Supertable.create(str(tmp_path / "t"), SCHEMA, vector_column="emb")
    t.append(data.slice(0, 1000))
    grid = t.properties["grid"]
    assert grid["n_cells"] == 32  # about sqrt(1000)
    t.append(data.slice(1000))
    assert t.properties["grid"] == grid


def test_bad_input_names_row_and_column_and_commits_nothing(tmp_path):
    t = Supertable.create(str(tmp_path / "t"), SCHEMA, vector_column="emb", fts_columns=["body"])
    good, _ = _data(10)
    wrong_len = pa.table({"year": [1], "body": ["x"], "emb": pa.array([[0.0] * (D - 1)])})
    with pytest.raises(SchemaMismatchError, match=r"'emb': row 0 has 15 values"):
        t.append(wrong_len)
    nan = np.zeros((3, D), np.float32)
    nan[2, 5] = np.nan
    bad = good.slice(0, 3).set_column(2, "emb", pa.FixedSizeListArray.from_arrays(pa.array(nan.ravel()), D))
    with pytest.raises(SchemaMismatchError, match="row 2 holds NaN"):
        t.append(bad)
    with pytest.raises(SchemaMismatchError, match="'year' has type string"):
        t.append(good.set_column(0, "year", pa.array(["x"] * 10)))
    with pytest.raises(SchemaMismatchError, match="not in the table schema"):
        t.append(good.append_column("extra", pa.array([1] * 10)))
    strict = Supertable.create(str(tmp_path / "s"), pa.schema([pa.field("a", pa.int64(), nullable=False)]))
    with pytest.raises(SchemaMismatchError, match="non-nullable column 'a' is missing"):
        strict.append(pa.table({}))
    with pytest.raises(SchemaMismatchError, match="row 1 is null"):
        strict.append(pa.table({"a": [1, None]}))
    with pytest.raises(MemoryBudgetError, match="budget"):
        t.append(good, memory_budget_bytes=100)
    assert t.refresh().version == 0 and t.count_rows() == 0
    t.append(good)
    with pytest.raises(ValueError, match="k must be a positive int"):
        t.search(vector=np.zeros(D), k=0)
    with pytest.raises(ValueError, match="must have 16 values"):
        t.search(vector=np.zeros(D + 1))
    with pytest.raises(SupertableError, match="no vector column"):
        strict.search(vector=[1.0])
    with pytest.raises(SupertableError, match="no text columns"):
        strict.search(text="x")


@pytest.mark.parametrize("shortlist", [False, True])
def test_fine_runs_and_bit_shortlists_keep_recall(tmp_path, monkeypatch, shortlist):
    from beam_supertable.format import superfile
    from beam_supertable.vector import search as vs

    monkeypatch.setattr(superfile, "FINE_RUN_BYTES", 16384)    # ~900 rows a fine run
    if shortlist:  # 1-bit codes pick the best half of every run before SQ8 scoring
        monkeypatch.setattr(vs, "SHORTLIST_MIN_ENTRIES", 64)
        monkeypatch.setattr(vs, "SHORTLIST_SHARE", 0.5)
    rng = np.random.default_rng(3)
    dim = 64
    x = (rng.normal(size=(8, dim)) * 3)[rng.integers(0, 8, 6000)] + rng.normal(size=(6000, dim))
    x = x.astype(np.float32)
    schema = pa.schema([("emb", pa.list_(pa.float32(), dim))])
    t = Supertable.create(str(tmp_path / "t"), schema, vector_column="emb", n_cells=3)
    t.append(pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim)}))
    header = t._reader(t.superfiles()[0]).header["vector"]
    assert max(c[4] for c in header["cells"]) > 1  # cells were split into fine runs
    ids = t.to_arrow(columns=["_id", "emb"])
    pos = {i: j for j, i in enumerate(ids["_id"].to_pylist())}
    emb = np.asarray(ids["emb"].combine_chunks().flatten().to_numpy(), np.float32).reshape(-1, dim)
    queries = x[:30] + 0.05
    truth = nearest(queries, emb, "l2", 10)
    got = t.search(vector=queries, k=10, nprobe=3)
    hits = sum(len({pos[i] for i in got.filter(pc.field("_query") == qi)["_id"].to_pylist()}
                   & set(truth[qi].tolist())) for qi in range(30))
    assert hits / 300 >= 0.9


def test_concurrent_first_appends_agree_on_one_grid(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb")
    a, b = Supertable.open(uri), Supertable.open(uri)
    data, x = _data(2000, seed=4)
    a.append(data.slice(0, 1000))
    b.append(data.slice(1000))  # its grid stamp loses; it re-assigns against a's grid
    t = Supertable.open(uri)
    assert t.count_rows() == 2000
    assert {e["grid"] for e in t.superfiles()} == {t.properties["grid"]["sha256"]}
    assert _recall(t, x, x[:20] + 0.05) >= 0.9


def test_append_of_row_dicts_refuses_a_misspelled_key_in_a_later_row(local_uri):
    """``Table.from_pylist`` takes its columns from the first row only, so a key the
    schema lacks in any later row vanishes silently (``y`` becomes null)."""
    from beam_supertable import SchemaMismatchError

    t = Supertable.create(local_uri, pa.schema([("x", pa.int64()), ("y", pa.int64())]))
    with pytest.raises(SchemaMismatchError, match="yy"):
        t.append([{"x": 1, "y": 1}, {"x": 2, "yy": 5}])
    assert t.refresh().count_rows() == 0


@pytest.mark.parametrize("call", ["upsert", "append"])
def test_row_dicts_with_an_int_beyond_64_bits_name_column_and_row(tmp_path, call):
    """``upsert``/``append`` of row dicts holding 2**70 raised a bare OverflowError
    ("Python int too large to convert to C long") naming nothing."""
    t = Supertable.create(str(tmp_path / "t"), pa.schema([("id", pa.int64()), ("n", pa.int32())]),
                          primary_key="id")
    t.upsert([{"id": 7, "n": 7}])
    with pytest.raises(SchemaMismatchError, match=r"column 'id', row 1"):
        getattr(t, call)([{"id": 1, "n": 1}, {"id": 2**70, "n": 1}])
    assert Supertable.open(str(tmp_path / "t")).to_arrow(columns=["id", "n"]).to_pylist() == [
        {"id": 7, "n": 7}]


KEYED_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()),
                          ("emb", pa.list_(pa.float32(), 4))])


def test_append_without_the_vector_column_names_it(tmp_path):
    from beam_supertable import SchemaMismatchError
    t = Supertable.create(str(tmp_path / "t"), KEYED_SCHEMA, vector_column="emb")
    with pytest.raises(SchemaMismatchError, match="vector column 'emb' is missing"):
        t.append(pa.table({"id": [1], "name": ["x"]}))
    assert Supertable.open(str(tmp_path / "t")).version == 0


def test_a_copied_handle_reads_searches_and_writes_as_itself(tmp_path):
    import copy

    uri = str(tmp_path / "copied")
    t = Supertable.create(uri, pa.schema([("b", pa.string())]), fts_columns=["b"])
    t.append(pa.table({"b": ["cat"]}))
    first = t.checkout(1)
    clone = copy.copy(first)
    t.append(pa.table({"b": ["cat cat"]}))
    clone.refresh()
    assert (clone.version, clone.to_arrow().num_rows,
            clone.search(text="cat", k=10).num_rows) == (2, 2, 2)
    clone.append(pa.table({"b": ["dog"]}))
    assert (clone.version, first.version) == (3, 1)
    deep = copy.deepcopy(clone)
    assert deep.version == 3 and deep.search(text="dog", k=1).num_rows == 1


def test_a_dropped_handle_frees_its_caches_at_once(tmp_path):
    import weakref

    uri = str(tmp_path / "dropped")
    t = Supertable.create(uri, pa.schema([("b", pa.string())]), fts_columns=["b"])
    t.append(pa.table({"b": ["cat"]}))
    handle = Supertable.open(uri)
    handle.search(text="cat", k=1)
    ref = weakref.ref(handle)
    del handle
    assert ref() is None, "a handle must not sit in a reference cycle with its caches"


def test_append_and_upsert_go_through_the_public_write_steps(tmp_path):
    calls = []

    class Traced(Supertable):
        def write_superfiles(self, *args, **kwargs):
            calls.append("write")
            return super().write_superfiles(*args, **kwargs)

        def commit_superfiles(self, *args, **kwargs):
            calls.append("commit")
            return super().commit_superfiles(*args, **kwargs)

    uri = str(tmp_path / "traced")
    Supertable.create(uri, pa.schema([("id", pa.int64())]), primary_key="id")
    table = Traced.open(uri)
    table.append(pa.table({"id": [1]}))
    table.upsert(pa.table({"id": [1]}))
    assert calls == ["write", "commit", "write", "commit"]
