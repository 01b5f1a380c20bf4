"""Search under a filter: recall targets hold for the rows the filter lets through."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import Supertable
from tests.beam_supertable.test_optimize import _many_clusters
from tests.beam_supertable.test_optimize import _recall as _recall_vs_every_cell


def _overlapping(tmp_path, n=8_000, dim=16, seed=3):
    """Overlapping Gaussian clusters (the hard shape: many cells per query)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n // 20, dim))
    x = (centres[rng.integers(0, len(centres), n)] + rng.normal(size=(n, dim))).astype("float32")
    q = (centres[rng.integers(0, len(centres), 40)] + rng.normal(size=(40, dim))).astype("float32")
    data = pa.table({"id": np.arange(n), "g": rng.integers(0, 10, n),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim)})
    t = Supertable.create(str(tmp_path / "t"), data.schema, vector_column="emb")
    t.append(data)
    return t, x, data["g"].to_numpy(), q


def _recall(t, x, allowed, queries, where, **kwargs):
    ids = np.flatnonzero(allowed)
    out = []
    for q in queries:
        truth = ids[np.argsort(((x[ids] - q) ** 2).sum(1), kind="stable")[:10]]
        got = t.search(vector=q, k=10, filter=where, **kwargs).column("id").to_numpy()
        out.append(len(set(truth.tolist()) & set(got.tolist())) / 10)
    return float(np.mean(out))


@pytest.mark.parametrize("batch", [False, True])
def test_default_recall_holds_under_a_ten_percent_filter(tmp_path, batch):
    """The probe law counts cells for the whole table; a filter passing 10% of
    the rows leaves each cell a tenth of the candidates, so the unfiltered
    count found about 0.88 of the filtered top 10. The search now probes as
    many more cells as the share of candidates passing says."""
    t, x, g, queries = _overlapping(tmp_path)
    where = pc.field("g") == 3
    if batch:
        got = t.search(vector=queries, k=10, filter=where)
        ids = np.flatnonzero(g == 3)
        hits = []
        for i, q in enumerate(queries):
            truth = ids[np.argsort(((x[ids] - q) ** 2).sum(1), kind="stable")[:10]]
            mine = got.filter(pc.equal(got["_query"], i))["id"].to_numpy()
            assert (g[mine] == 3).all()
            hits.append(len(set(truth.tolist()) & set(mine.tolist())) / 10)
        assert np.mean(hits) >= 0.95
    else:
        assert _recall(t, x, g == 3, queries, where) >= 0.95


def test_explicit_nprobe_under_a_filter_is_not_widened_by_selectivity(tmp_path):
    """``nprobe`` is the caller's bound: a filter does not multiply it (only a
    query short of k rows widens, as before)."""
    t, x, g, queries = _overlapping(tmp_path)
    where = pc.field("g") == 3
    narrow = _recall(t, x, g == 3, queries, where, nprobe=2)
    assert narrow < _recall(t, x, g == 3, queries, where)


# -- a recall target under a selective filter, on many clustered appends -------------
def test_recall_target_holds_under_a_selective_filter(tmp_path):
    t, queries = _many_clusters(str(tmp_path / "t"))
    assert _recall_vs_every_cell(t, queries) >= 0.95                  # unfiltered: holds
    assert _recall_vs_every_cell(t, queries, pc.field("g") == 3, recall_target=0.99) >= 0.95
