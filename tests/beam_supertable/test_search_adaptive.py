"""Adaptive probing (bisector bounds) and recall at default settings on four data shapes."""

import ast
import os
import re
import sysconfig

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable
from beam_supertable.format.reader import IOStats, SuperfileReader
from beam_supertable.vector import calibrate
from beam_supertable.vector import search as vs
from beam_supertable.vector.metric import bisector_bounds, distances, nearest, prepare


def _table(uri, x, metric="l2", **kw):
    schema = pa.schema([("emb", pa.list_(pa.float32(), x.shape[1]))])
    t = Supertable.create(uri, schema, vector_column="emb", metric=metric, **kw)
    t.append(pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])}))
    return t


def _truth(t, queries, metric, k=10):
    rows = t.to_arrow(columns=["_id", "emb"])
    emb = np.asarray(rows["emb"].combine_chunks().flatten().to_numpy(), np.float32).reshape(
        rows.num_rows, -1)
    return rows["_id"].to_numpy()[nearest(prepare(queries, metric), prepare(emb, metric), metric, k)]


def _recall(t, queries, metric, k=10, **kw):
    truth = _truth(t, queries, metric, k)
    got = t.search(vector=queries, k=k, columns=[], **kw)
    q, ids = got["_query"].to_numpy(), got["_id"].to_numpy()
    return np.mean([len(set(ids[q == i]) & set(truth[i])) / k for i in range(len(queries))])


def _clusters(n, queries, scale, dim=32, clusters=120, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)) * scale
    x = centers[rng.integers(0, clusters, n)] + rng.normal(size=(n, dim))
    q = centers[rng.integers(0, clusters, queries)] + rng.normal(size=(queries, dim))
    return x.astype(np.float32), q.astype(np.float32)


# -- the bound ----------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), metric=st.sampled_from(["l2", "cosine"]),
       n_cells=st.integers(2, 12), dim=st.integers(2, 9), spread=st.floats(0.1, 10.0))
def test_bound_never_exceeds_a_cells_nearest_row(seed, metric, n_cells, dim, spread):
    rng = np.random.default_rng(seed)
    centroids = prepare(rng.normal(size=(n_cells, dim)).astype(np.float32) * spread, metric)
    rows = prepare(rng.normal(size=(400, dim)).astype(np.float32) * spread, metric)
    queries = prepare(rng.normal(size=(25, dim)).astype(np.float32) * spread, metric)
    cell_of = nearest(rows, centroids, metric, 1)[:, 0]       # the writer's assignment
    ranked = nearest(queries, centroids, metric, n_cells)
    bounds = bisector_bounds(queries, centroids, ranked, metric)
    d = distances(queries, rows, metric)
    for qi in range(len(queries)):
        for j, cell in enumerate(ranked[qi]):
            members = cell_of == cell
            if members.any():
                closest = d[qi, members].min()
                assert bounds[qi, j] <= closest + 1e-4 * max(1.0, abs(float(closest))), \
                    (qi, j, bounds[qi, j], closest)


def test_no_bound_for_dot():
    with pytest.raises(ValueError, match="dot"):
        bisector_bounds(np.zeros((1, 2), np.float32), np.eye(2, dtype=np.float32),
                        np.array([[0, 1]]), "dot")


# -- adaptive probing -----------------------------------------------------------
def test_adaptive_probing_skips_cells_and_never_loses_recall(tmp_path):
    x, q = _clusters(12_000, 300, scale=6.0, seed=1)
    t = _table(str(tmp_path / "t"), x, n_cells=96)
    centroids = t.grid()
    truth = _truth(t, q, "l2")
    ids = {e["id"]: None for e in t.superfiles()}

    def run(with_bounds):
        io = IOStats()
        indexes = [vs.VectorIndex(SuperfileReader(t.store, e, io)) for e in t.superfiles()]
        probes = vs.rank_cells(prepare(q, "l2"), centroids, "l2", 12, with_bounds)
        dist, sfs, rows = vs.vector_search(indexes, prepare(q, "l2"), probes, "l2", 10)
        reads = io.snapshot()["bytes"]
        row_ids = [r.ids() for r in (ix.reader for ix in indexes)]
        found = [[row_ids[s][r] for s, r in zip(srow, rrow) if r >= 0]
                 for srow, rrow in zip(sfs, rows)]
        return dist, found, reads

    assert len(ids) >= 1
    plain_dist, plain, plain_reads = run(False)
    adaptive_dist, adaptive, adaptive_reads = run(True)
    # Skipped cells cannot hold a row of the top k: each query's k-th distance
    # is no worse, and recall against brute force is no lower.
    assert np.all(adaptive_dist[:, -1] <= plain_dist[:, -1] + 1e-4)
    recall = lambda found: np.mean([len(set(f) & set(tr)) / 10 for f, tr in zip(found, truth)])
    assert recall(adaptive) >= recall(plain) >= 0.99
    # ...and it does skip cells: a few queries (12 cells each) read far fewer
    # bytes of codes (near runs share a ranged read, so bytes, not requests, tell).
    q = q[:4]
    assert run(True)[2] < run(False)[2] / 2


def test_adaptive_probing_is_the_default_where_the_law_finds_it_pays(tmp_path):
    x, q = _clusters(12_000, 200, scale=6.0, seed=2)
    t = _table(str(tmp_path / "t"), x, n_cells=96)
    law = calibrate.ProbeLaw.from_json(t.properties[calibrate.LAW_PROPERTY])
    grid = t.properties["grid"]["sha256"]
    assert calibrate.adaptive(law, grid, 8)          # separated clusters: bounds skip cells
    assert _recall(t, q, "l2", nprobe=8) >= 0.99
    y, _ = _clusters(12_000, 10, scale=0.2, seed=3)
    u = _table(str(tmp_path / "u"), y, n_cells=96)
    law_u = calibrate.ProbeLaw.from_json(u.properties[calibrate.LAW_PROPERTY])
    assert not calibrate.adaptive(law_u, u.properties["grid"]["sha256"], 8)  # one blob: they do not


# -- recall at default settings on small versions of the benchmark's shapes ---
def _stdlib_paragraphs(limit_files=120):
    root = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(root) if n.endswith(".py"))[:limit_files]
    docs = []
    for name in names:
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.extend(" ".join(p.split()) for p in re.split(r"\n\s*\n", doc))
    return list(dict.fromkeys(d for d in docs if len(d) >= 40))


def _lsa(queries):
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer
    docs = _stdlib_paragraphs()
    tfidf = TfidfVectorizer(sublinear_tf=True, min_df=2).fit_transform(docs)
    x = TruncatedSVD(48, random_state=0).fit_transform(tfidf).astype(np.float32)
    perm = np.random.default_rng(0).permutation(len(x))
    return x[perm[queries:]], x[perm[:queries]]


def _digits(queries):
    from sklearn.datasets import load_digits
    x = load_digits().data.astype(np.float32)
    perm = np.random.default_rng(0).permutation(len(x))
    return x[perm[queries:]], x[perm[:queries]]


@pytest.mark.parametrize("shape", ["overlapping", "separated", "lsa", "digits"])
def test_default_recall_reaches_the_target(tmp_path, shape):
    metric = "l2"
    if shape == "overlapping":
        x, q = _clusters(15_000, 200, scale=1.0, seed=4)
    elif shape == "separated":
        x, q = _clusters(15_000, 200, scale=5.0, seed=4)
    elif shape == "lsa":
        x, q = _lsa(200)
        metric = "cosine"
        assert len(x) > 1500
    else:
        x, q = _digits(200)
    t = _table(str(tmp_path / "t"), x, metric)
    assert _recall(t, q, metric) >= 0.95
