"""Batches on small tables: answered from the table's live vectors held whole.

The results must be those of the general path: exact where every cell is
probed, blind to deleted rows, and never stale after a commit.
"""

import math
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable
from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format import schema as schema_mod
from beam_supertable.vector import dense
from beam_supertable.vector.metric import prepare


def _data(x, start=0):
    return pa.table({"id": np.arange(start, start + len(x)),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])})


def _exact(x, ids, q, metric, k):
    """(ids, distances) of the ``k`` nearest, as the metric defines distance."""
    xp, qp = prepare(x, metric), prepare(q, metric)
    if metric == "l2":
        d = ((xp[None, :, :] - qp[:, None, :]) ** 2).sum(-1)
    elif metric == "cosine":
        d = 1.0 - qp @ xp.T
    else:
        d = -(qp @ xp.T)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return ids[order], np.take_along_axis(d, order, 1)


def _per_query(got, n_q):
    qcol = got["_query"].to_numpy()
    return ([got["id"].to_numpy()[qcol == i] for i in range(n_q)],
            [got["_distance"].to_numpy()[qcol == i] for i in range(n_q)])


@pytest.mark.parametrize("metric", ["l2", "cosine", "dot"])
def test_a_batch_probing_every_cell_is_exact_over_live_rows(tmp_path, metric):
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(300, 8)).astype("float32") for _ in range(3)]
    t = Supertable.create(str(tmp_path / "t"), _data(parts[0]).schema, vector_column="emb",
                          metric=metric)
    for i, x in enumerate(parts):
        t.append(_data(x, 300 * i))
    t.delete(pc.field("id").isin(list(range(0, 900, 7))))
    x, ids = np.concatenate(parts), np.arange(900)
    live = ids % 7 != 0
    q = rng.normal(size=(25, 8)).astype("float32")
    got = t.search(vector=q, k=10, columns=["id"], recall_target=1.0)
    want_ids, want_d = _exact(x[live], ids[live], q, metric, 10)
    got_ids, got_d = _per_query(got, len(q))
    for i in range(len(q)):
        np.testing.assert_allclose(got_d[i], want_d[i], rtol=1e-4, atol=1e-4)
        assert set(got_ids[i]) == set(want_ids[i])


def test_a_handle_holding_the_table_whole_sees_its_later_commits(tmp_path):
    """The held vectors are keyed by the superfiles and their deletion vectors:
    a delete or an append through the handle is seen by the next batch."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 8)).astype("float32")
    t = Supertable.create(str(tmp_path / "t"), _data(x).schema, vector_column="emb")
    t.append(_data(x))
    q = x[:20] + np.float32(0.01)
    first = t.search(vector=q, k=1, columns=["id"])
    assert first["id"].to_pylist() == list(range(20))       # each query's own row
    t.delete(pc.field("id") < 10)
    second = t.search(vector=q, k=1, columns=["id"])
    assert not set(second["id"].to_pylist()) & set(range(10))
    t.append(_data(q[:5], 1_000))
    third = t.search(vector=q, k=1, columns=["id"])
    assert third["id"].to_pylist()[:5] == list(range(1_000, 1_005))
    assert third["_distance"].to_numpy()[:5].max() == 0.0


def test_single_queries_agree_with_the_batch(tmp_path):
    """A single query (general path on a cold handle, the held vectors on a
    warm one) finds what the batch finds, at the same recall target."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2_000, 16)).astype("float32")
    t = Supertable.create(str(tmp_path / "t"), _data(x).schema, vector_column="emb")
    t.append(_data(x))
    q = rng.normal(size=(12, 16)).astype("float32")
    cold = [t.search(vector=v, k=10, columns=["id"], recall_target=1.0)["id"].to_pylist()
            for v in q]
    batch, _ = _per_query(t.search(vector=q, k=10, columns=["id"], recall_target=1.0), len(q))
    warm = [t.search(vector=v, k=10, columns=["id"], recall_target=1.0)["id"].to_pylist()
            for v in q]
    assert [list(b) for b in batch] == cold == warm


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 120), dim=st.integers(1, 6), k=st.integers(1, 12),
       metric=st.sampled_from(["l2", "cosine", "dot"]), seed=st.integers(0, 2**16))
def test_property_batches_match_brute_force(tmp_path_factory, n, dim, k, metric, seed):
    rng = np.random.default_rng(seed)
    # Few distinct values: ties and duplicate rows are common.
    x = rng.integers(-3, 4, size=(n, dim)).astype("float32")
    if metric == "cosine":
        x[np.all(x == 0, axis=1)] = 1.0
    t = Supertable.create(str(tmp_path_factory.mktemp("t") / "t"), _data(x).schema,
                          vector_column="emb", metric=metric)
    t.append(_data(x))
    q = rng.integers(-3, 4, size=(9, dim)).astype("float32") + np.float32(0.5)
    got = t.search(vector=q, k=k, columns=["id"], recall_target=1.0)
    want_ids, want_d = _exact(x, np.arange(n), q, metric, k)
    got_ids, got_d = _per_query(got, len(q))
    for i in range(len(q)):
        assert len(got_ids[i]) == min(k, n)
        np.testing.assert_allclose(got_d[i], want_d[i], rtol=1e-4, atol=1e-4)
        # Ids agree wherever the distance is not tied with the k-th.
        sure = want_d[i] < want_d[i][-1] - 1e-4
        assert set(want_ids[i][sure]) <= set(got_ids[i])


def test_a_batch_on_a_table_whose_rows_are_all_deleted_finds_nothing(tmp_path):
    """The held table is then empty: the batch returns no rows (it raised
    IndexError), and rows appended later are found."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 8)).astype("float32")
    t = Supertable.create(str(tmp_path / "t"), _data(x).schema, vector_column="emb")
    t.append(_data(x))
    t.delete(pc.field("id") >= 0)
    assert t.search(vector=x[:5], k=3, columns=["id"]).num_rows == 0
    assert t.search(vector=x[0], k=3, columns=["id"]).num_rows == 0
    t.append(_data(x[:5], 1_000))
    got = t.search(vector=x[:5], k=1, columns=["id"])
    assert got["id"].to_pylist() == list(range(1_000, 1_005))
    assert got["_distance"].to_pylist() == [0.0] * 5


@pytest.mark.parametrize("metric", ["l2", "cosine", "dot"])
@pytest.mark.parametrize("k", [3, 10, 40])
def test_the_held_table_answers_as_the_general_path(tmp_path, monkeypatch, metric, k):
    """A batch on a small table (rows held whole) returns what the general
    path returns for it (a handle on which no table is small enough to be
    held): the same rows and distances, at the default probes, at a given
    nprobe and probing every cell, over several superfiles with deleted
    rows; k=40 is more than many cells hold (a query's cut-off then comes
    from all its cells); 300 queries probing every cell make products
    large enough to be thresholded one by one. (At the default probes, k=40 leaves a few queries
    short of 40 live rows in their cells: the general path then widens its
    probe, as it does for a filter, while the held rows answer from the
    probed cells only; so that case is compared for the smaller k.)"""
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(12, 16)) * 3
    parts = [(centres[rng.integers(0, 12, n)] + rng.normal(size=(n, 16))).astype("float32")
             for n in (400, 250, 150)]
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, _data(parts[0]).schema, vector_column="emb", metric=metric)
    start = 0
    for x in parts:
        t.append(_data(x, start))
        start += len(x)
    t.delete(pc.field("id").isin(list(range(0, start, 9))))
    q = (centres[rng.integers(0, 12, 300)] + rng.normal(size=(300, 16))).astype("float32")
    cases = [(q[:60], {"recall_target": 1.0}), (q[:60], {"nprobe": 2}), (q, {"recall_target": 1.0})]
    if k < 40:
        cases.append((q[:60], {}))
    held = [Supertable.open(uri).search(vector=v, k=k, columns=["id"], **c) for v, c in cases]
    monkeypatch.setattr(dense, "DENSE_MAX_BYTES", 0)
    general = [Supertable.open(uri).search(vector=v, k=k, columns=["id"], **c) for v, c in cases]
    for mine, theirs in zip(held, general):
        assert mine["_query"].to_pylist() == theirs["_query"].to_pylist()
        assert mine["id"].to_pylist() == theirs["id"].to_pylist()
        np.testing.assert_allclose(mine["_distance"].to_numpy(), theirs["_distance"].to_numpy(),
                                   rtol=1e-6, atol=1e-6)
        assert not set(mine["id"].to_pylist()) & set(range(0, start, 9))


def _blas_threads():
    from threadpoolctl import threadpool_info
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_batches_racing_on_one_handle_answer_as_one(tmp_path):
    """Threads searching one handle at once (sharing its cached index, and
    setting the process's BLAS thread counts) get one answer, and leave the
    counts as they were."""
    import threading

    rng = np.random.default_rng(3)
    x = rng.normal(size=(1500, 16)).astype(np.float32)
    t = Supertable.create(str(tmp_path / "t"), _data(x).schema, vector_column="emb")
    t.append(_data(x))
    q = rng.normal(size=(50, 16)).astype(np.float32)
    want = t.search(vector=q, k=5, columns=["id"])   # (loads every BLAS library it uses)
    before = _blas_threads()
    got = [None] * 6

    def run(i):
        for _ in range(20):
            got[i] = t.search(vector=q, k=5, columns=["id"])

    racers = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for th in racers:
        th.start()
    for th in racers:
        th.join(60)
    assert all(g is not None and g.equals(want) for g in got)
    assert _blas_threads() == before


@pytest.mark.parametrize("metric", ["l2", "dot", "cosine"])
@pytest.mark.parametrize("dtype, scale", [(np.float32, 1e20), (np.float64, 1e20),
                                          (np.float64, 1e200)])
def test_a_row_too_large_for_float32_distances_is_refused_naming_it(
        tmp_path, metric, dtype, scale):
    """Finite vectors of ~1e20 square past float32: distances (and the grid's
    training) overflow, and search would find nothing, or a few rows, silently."""
    x = np.random.default_rng(2).normal(size=(40, 4)).astype(dtype)
    t = Supertable.create(str(tmp_path / "t"), _data(x).schema, vector_column="emb",
                          metric=metric)
    t.append(_data(x))
    huge = x.copy()
    huge[7] *= scale
    with pytest.raises(SchemaMismatchError, match="vector column 'emb': row 7 is too large: "
                                                  "its squared norm overflows float32"):
        t.append(_data(huge, start=40))
    assert t.refresh().count_rows() == 40


@pytest.mark.parametrize("metric", ["l2", "dot", "cosine"])
@pytest.mark.parametrize("batch", [False, True])
def test_a_table_written_with_rows_too_large_is_refused_unless_cosine(
        tmp_path, monkeypatch, metric, batch):
    """A table written before such rows were refused: l2 and dot search say so
    in one line; cosine compares directions, and answers."""
    monkeypatch.setattr(schema_mod, "overflowing_row", lambda *args: None)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(400, 4)) * 1e20
    q = rng.normal(size=(20, 4)).astype(np.float32)
    q = q if batch else q[0]
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # (sklearn's k-means casts too)
        t = Supertable.create(str(tmp_path / "t"), _data(x.astype(np.float32)).schema,
                              vector_column="emb", metric=metric)
        t.append(_data(x.astype(np.float32)))
        if metric != "cosine":
            with pytest.raises(ValueError, match="the table's vectors are too large for "
                                                 f"{metric} distances in float32"):
                t.search(vector=q, k=10, columns=["id"])
            return
        got = t.search(vector=q, k=10, nprobe=400, columns=["id"])
    # The reference in float64, apart from the code under test.
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    qs = np.atleast_2d(q).astype(np.float64)
    want = np.argsort(-(qs @ unit.T) / np.linalg.norm(qs, axis=1, keepdims=True), axis=1,
                      kind="stable")[:, :10]
    ids = _per_query(got, len(q))[0] if batch else [got["id"].to_numpy()]
    assert [i.tolist() for i in ids] == want.tolist()


@pytest.mark.parametrize("batch", [False, True])
def test_a_query_too_large_for_float32_distances_is_refused_naming_it(tmp_path, batch):
    """The rule rows are written by: a squared norm past float32's quarter
    (norm about 9.2e18) would overflow an l2 distance or a dot product."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    tables = {}
    for metric in ("l2", "dot", "cosine"):
        tables[metric] = Supertable.create(str(tmp_path / metric), _data(x).schema,
                                           vector_column="emb", metric=metric)
        tables[metric].append(_data(x))
    q = rng.normal(size=(3, 8))
    for scale in (1e19, 1e39, 1e200):   # (float64 queries may pass float32's range)
        huge = q.copy()
        huge[-1] *= scale
        for metric in ("l2", "dot"):
            with pytest.raises(ValueError, match=f"query vector {2 if batch else 0} is too "
                                                 "large: its squared norm overflows float32"):
                tables[metric].search(vector=huge if batch else huge[-1], k=5)
        # A cosine query is its direction, however long or short.
        for size in (scale, 1 / scale):
            got = tables["cosine"].search(vector=q[-1] * size, k=5, nprobe=10_000,
                                          columns=["id"])
            want, _ = _exact(x, np.arange(300), q[-1:].astype(np.float32), "cosine", 5)
            assert got["id"].to_pylist() == want[0].tolist()
    fits = q[-1] / np.linalg.norm(q[-1]) * 9e18   # within the rule: answered
    for metric in ("l2", "dot"):
        assert tables[metric].search(vector=fits, k=5).num_rows == 5


def test_a_column_asked_for_twice_is_refused(tmp_path):
    x = np.random.default_rng(4).normal(size=(50, 4)).astype(np.float32)
    t = Supertable.create(str(tmp_path / "t"), _data(x).schema, vector_column="emb")
    t.append(_data(x))
    with pytest.raises(ValueError, match=r"column\(s\) \['id'\] asked for more than once"):
        t.search(vector=x[0], k=3, columns=["id", "emb", "id"])
    assert t.search(vector=x[0], k=3, columns=["id", "emb"]).column_names == [
        "_id", "id", "emb", "_distance"]


def test_a_refreshed_handle_searches_the_new_schema_and_rows(tmp_path):
    """A handle keeps its result schema and the held table's key per version:
    after another handle overwrites the table (same column names, another
    type), a refresh answers with the new schema, empty or not, and the old
    version still answers as before."""
    uri = str(tmp_path / "t")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    t = Supertable.create(uri, _data(x).schema, vector_column="emb")
    v1 = t.append(_data(x))
    q = x[:4] + 0.01
    before = t.search(vector=q, k=3)
    assert before.schema.field("id").type == pa.int64()

    y = rng.normal(size=(200, 8)).astype(np.float32)
    retyped = pa.table({"id": [f"k{i}" for i in range(200)],
                        "emb": pa.FixedSizeListArray.from_arrays(pa.array(y.ravel()), 8)})
    other = Supertable.create(uri, retyped.schema, vector_column="emb", mode="overwrite")
    empty = t.refresh().search(vector=q, k=3)
    assert empty.num_rows == 0 and empty.schema.field("id").type == pa.string()

    other.append(retyped)
    after = t.refresh().search(vector=y[:4] + 0.01, k=3)
    assert after.schema.field("id").type == pa.string()
    assert after["id"].to_pylist()[::3] == ["k0", "k1", "k2", "k3"]
    again = Supertable.open(uri, version=v1).search(vector=q, k=3)
    assert again.equals(before)


# -- small keyed tables, deletes, upserts, optimize and stale handles ----------------
D = 4


def _vec_table(uri, n=50, metric="l2"):
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(n, D)).astype(np.float32)
    schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("emb", pa.list_(pa.float32(), D))])
    t = Supertable.create(uri, schema, primary_key="id", vector_column="emb", metric=metric)
    t.append(pa.table({"id": np.arange(n), "g": np.arange(n) % 5,
                       "emb": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), D)},
                      schema=schema))
    return Supertable.open(uri), vecs


def _ids(res):
    return res["id"].to_pylist()


@pytest.mark.parametrize("batch", [False, True])
def test_dense_search_after_delete_and_upsert_same_and_stale_handle(tmp_path, batch):
    uri = str(tmp_path / "t")
    t, vecs = _vec_table(uri)
    q = vecs[7]
    stale = Supertable.open(uri)

    def top(handle, k=3):
        extra = dict(recall_target=1.0) if k > 3 else {}
        if batch:
            res = handle.search(vector=np.stack([q, q]), k=k, columns=["id"], **extra)
            assert _ids(res.filter(pc.field("_query") == 0)) == _ids(
                res.filter(pc.field("_query") == 1))
            return _ids(res.filter(pc.field("_query") == 0))
        return _ids(handle.search(vector=q, k=k, columns=["id"], **extra))
    assert top(t)[0] == 7
    assert top(stale)[0] == 7   # warm the stale handle's caches
    t.delete(pc.field("id") == 7)
    assert 7 not in top(t)
    assert top(Supertable.open(uri))[0] != 7
    assert top(stale)[0] == 7   # the stale handle still reads its own version
    t.upsert(pa.table({"id": [8], "g": [0], "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(np.asarray(q, np.float32)), D)}, schema=t.user_schema))
    assert top(t)[0] == 8
    assert top(t, k=60).count(8) == 1
    assert top(Supertable.open(uri), k=60).count(8) == 1
    assert len(top(t, k=60)) == 49


@pytest.mark.parametrize("metric", ["l2", "cosine", "dot"])
def test_dense_search_zero_match_filter_and_k_above_size(tmp_path, metric):
    uri = str(tmp_path / "t")
    t, vecs = _vec_table(uri, metric=metric)
    q = vecs[3]
    assert t.search(vector=q, k=5, filter=pc.field("g") == 99, columns=["id"]).num_rows == 0
    res = t.search(vector=np.stack([q, q]), k=5, filter=pc.field("g") == 99, columns=["id"])
    assert res.num_rows == 0
    every = dict(columns=["id"], recall_target=1.0)
    assert sorted(_ids(t.search(vector=q, k=500, **every))) == list(range(50))
    both = t.search(vector=np.stack([q, q]), k=500, **every)
    assert sorted(_ids(both)) == sorted(list(range(50)) * 2)
    sel = t.search(vector=q, k=500, filter=pc.field("g") == 2, **every)
    assert sorted(_ids(sel)) == list(range(2, 50, 5))
    sel = t.search(vector=np.stack([q, q]), k=500, filter=pc.field("g") == 2, **every)
    assert sorted(_ids(sel)) == sorted(list(range(2, 50, 5)) * 2)
    sel = t.search(vector=q, k=3, filter=pc.field("g") == 2, columns=["id"], recall_target=0.95)
    assert len(_ids(sel)) == 3


def test_cosine_zero_vectors(tmp_path):
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("emb", pa.list_(pa.float32(), D))])
    t = Supertable.create(uri, schema, vector_column="emb", metric="cosine")
    vecs = np.eye(D, dtype=np.float32)
    vecs = np.vstack([vecs, np.zeros((1, D), np.float32)])
    t.append(pa.table({"id": np.arange(len(vecs)), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(vecs.ravel()), D)}, schema=schema))
    t = Supertable.open(uri)
    res = t.search(vector=vecs[1], k=5, columns=["id"])
    assert _ids(res)[0] == 1
    scores = [c for c in res.column_names if c not in ("id",)]
    for c in scores:
        if pa.types.is_floating(res[c].type):
            assert all(not math.isnan(x) for x in res[c].to_pylist()), c
    zero = t.search(vector=np.zeros(D, np.float32), k=5, columns=["id"])
    for c in zero.column_names:
        if pa.types.is_floating(zero[c].type):
            assert all(not math.isnan(x) for x in zero[c].to_pylist()), c
    batch = t.search(vector=np.stack([vecs[1], np.zeros(D, np.float32)]), k=5, columns=["id"])
    for c in batch.column_names:
        if pa.types.is_floating(batch[c].type):
            assert all(not math.isnan(x) for x in batch[c].to_pylist()), c


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_dense_search_same_answer_after_optimize_on_every_handle(tmp_path, metric):
    uri = str(tmp_path / "t")
    t, vecs = _vec_table(uri, metric=metric)
    rng = np.random.default_rng(1)
    more = rng.normal(size=(30, D)).astype(np.float32)
    t.append(pa.table({"id": np.arange(50, 80), "g": np.arange(30) % 5,
                       "emb": pa.FixedSizeListArray.from_arrays(pa.array(more.ravel()), D)},
                      schema=t.user_schema))
    t.delete(pc.field("id").isin([3, 7, 60]))
    qs = np.vstack([vecs[:4], more[:4]])
    every = dict(k=10, columns=["id"], recall_target=1.0)

    def answer(h):
        res = h.search(vector=qs, **every)
        return [_ids(res.filter(pc.field("_query") == i)) for i in range(len(qs))]
    before = answer(t)
    stale = Supertable.open(uri)
    assert answer(stale) == before
    t.optimize()
    assert answer(t) == before
    assert answer(stale) == before
    assert answer(Supertable.open(uri)) == before
    singles = [_ids(Supertable.open(uri).search(vector=q, **every)) for q in qs]
    assert singles == before
