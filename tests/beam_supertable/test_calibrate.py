"""Probe laws: measured at write time, stamped into the manifest, used as the search default."""

import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from beam_supertable import Supertable, WriteToSupertable
from beam_supertable.format.manifest import CommitRequest
from beam_supertable.vector import calibrate
from beam_supertable.vector import grid as grid_mod
from beam_supertable.vector.metric import nearest, prepare

D = 16
SCHEMA = pa.schema([("n", pa.int64()), ("emb", pa.list_(pa.float32(), D))])


def _clusters(n, scale, seed=0, clusters=40, dim=D):
    """Rows around ``clusters`` centres: scale 10 separates them, scale 0.5 overlaps them."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)) * scale
    return (centers[rng.integers(0, clusters, n)] + rng.normal(size=(n, dim))).astype(np.float32)


def _rows(x, start=0):
    return pa.table({"n": np.arange(start, start + len(x)),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])})


def _recall(t, queries, metric="l2", k=10, **kw):
    """recall@k of ``t.search`` against brute force over the table's rows."""
    rows = t.to_arrow(columns=["_id", "emb"])
    emb = np.asarray(rows["emb"].combine_chunks().flatten().to_numpy(), np.float32).reshape(
        rows.num_rows, -1)
    ids = rows["_id"].to_numpy()
    truth = ids[nearest(prepare(queries, metric), prepare(emb, metric), metric, k)]
    got = t.search(vector=queries, k=k, columns=[], **kw)
    q, found = got["_query"].to_numpy(), got["_id"].to_numpy()
    return np.mean([len(set(found[q == i]) & set(truth[i])) / k for i in range(len(queries))])


def _law(t):
    return calibrate.ProbeLaw.from_json(t.properties[calibrate.LAW_PROPERTY])


def test_harder_shape_needs_more_probes():
    easy = _clusters(6000, scale=10.0)
    hard = _clusters(6000, scale=0.5)
    laws = {}
    for name, x in (("easy", easy), ("hard", hard)):
        grid = grid_mod.train(x, 64, "l2")
        laws[name] = calibrate.measure(x, grid, "l2", name)
    assert laws["easy"].nprobe_for(0.95) < laws["hard"].nprobe_for(0.95)
    # A law's recall only grows with the probes, and a target of 1 probes everything.
    for law in laws.values():
        assert list(law.recall) == sorted(law.recall)
        assert law.nprobe_for(0.9) <= law.nprobe_for(0.95) <= law.nprobe_for(0.99)
        assert law.nprobe_for(1.0) == 64


def test_first_vector_write_stamps_a_law_of_its_grid(table_location):
    uri, options = table_location
    t = Supertable.create(uri, SCHEMA, vector_column="emb", storage_options=options)
    assert calibrate.LAW_PROPERTY not in t.properties
    t.append(_rows(_clusters(4000, scale=2.0)))
    law = t.properties[calibrate.LAW_PROPERTY]
    json.dumps(law)  # plain JSON data in the manifest
    assert law["grid"] == t.properties["grid"]["sha256"]
    assert law["n_cells"] == t.properties["grid"]["n_cells"]
    assert law["rows"] == 4000
    assert set(law["targets"]) == {"0.9", "0.95", "0.99"}
    assert calibrate.ProbeLaw.from_json(law).to_json() == law
    # Another handle reads the same law from the manifest.
    assert Supertable.open(uri, storage_options=options).properties[calibrate.LAW_PROPERTY] == law


def test_law_changes_when_the_data_changes_shape():
    uri = "memory://calibrate/shape-change"
    t = Supertable.create(uri, SCHEMA, vector_column="emb")
    easy = _clusters(3000, scale=10.0, seed=1)
    t.append(_rows(easy))
    first = _law(t)
    # A small append (the table grows by less than REGROW_FACTOR) keeps the law.
    t.append(_rows(_clusters(300, scale=10.0, seed=2), start=3000))
    assert _law(t) == first
    # Rows of another, harder shape, twice as many as the table held: a new law.
    # (One wide blob over the same space: neighbours cross the cells' borders.)
    hard = (np.random.default_rng(3).normal(size=(6600, D)) * 10).astype(np.float32)
    t.append(_rows(hard, start=3300))
    second = _law(t)
    assert second != first
    assert second.rows == 9900
    assert second.grid == first.grid
    assert second.nprobe_for(0.95) > first.nprobe_for(0.95)
    # The default still reaches the target for queries like the table's rows
    # (a law is a mean over the whole table: a third easy, two thirds hard).
    assert _recall(t, np.concatenate([easy[:60], hard[:120]]) + 0.01) >= 0.95


def test_concurrent_writers_replace_the_law_without_conflict():
    uri = "memory://calibrate/concurrent"
    Supertable.create(uri, SCHEMA, vector_column="emb").append(_rows(_clusters(1000, 2.0)))
    a, b = Supertable.open(uri), Supertable.open(uri)
    a.append(_rows(_clusters(3000, 2.0, seed=5), start=1000))
    # b still reads the first version; its law is due too and simply replaces a's.
    b.append(_rows(_clusters(3000, 2.0, seed=6), start=4000))
    t = Supertable.open(uri)
    assert t.count_rows() == 7000
    assert _law(t).grid == t.properties["grid"]["sha256"]
    assert [h["operation"] for h in t.history()][-2:] == ["append", "append"]


def test_write_to_supertable_stamps_a_law(tmp_path):
    uri = str(tmp_path / "t")
    x = _clusters(3000, scale=2.0)
    rows = [{"n": i, "emb": x[i].tolist()} for i in range(len(x))]
    with TestPipeline() as p:
        _ = p | beam.Create(rows) | WriteToSupertable(uri, schema=SCHEMA, vector_column="emb")
    t = Supertable.open(uri)
    law = _law(t)
    assert law.grid == t.properties["grid"]["sha256"] and law.rows == 3000


def test_default_uses_the_law_and_reaches_the_target():
    # Overlapping clusters need several cells; the law finds how many.
    x = _clusters(8000, scale=0.6, seed=7)
    queries = _clusters(200, scale=0.6, seed=8)   # same centres (same seed stream) is not needed:
    t = Supertable.create("memory://calibrate/default", SCHEMA, vector_column="emb")
    t.append(_rows(x))
    law = _law(t)
    n_cells = t.properties["grid"]["n_cells"]
    p95 = law.nprobe_for(0.95)
    assert 1 < p95 < n_cells
    held_out = x[:200] + np.random.default_rng(9).normal(scale=0.05, size=(200, D)).astype(np.float32)
    assert _recall(t, held_out) >= 0.95
    # The default is the law's answer: the same rows as asking for its nprobe.
    default = t.search(vector=queries, k=10, columns=[])
    explicit = t.search(vector=queries, k=10, columns=[], nprobe=p95)
    assert default["_id"].to_pylist() == explicit["_id"].to_pylist()


def test_recall_target_probes_more_for_more_recall():
    x = _clusters(8000, scale=0.6, seed=11)
    t = Supertable.create("memory://calibrate/targets", SCHEMA, vector_column="emb")
    t.append(_rows(x))
    queries = x[:150] + 0.05
    low = _recall(t, queries, recall_target=0.6)
    high = _recall(t, queries, recall_target=0.99)
    exact = _recall(t, queries, recall_target=1.0)
    assert low <= high <= exact == 1.0
    assert high >= 0.99 - 0.02   # the target is a mean: a little sampling noise


def test_search_argument_errors():
    t = Supertable.create("memory://calibrate/errors", SCHEMA, vector_column="emb")
    t.append(_rows(_clusters(500, 2.0)))
    q = np.zeros(D, np.float32)
    with pytest.raises(ValueError, match="nprobe or recall_target"):
        t.search(vector=q, nprobe=4, recall_target=0.9)
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="nprobe must be a positive int"):
            t.search(vector=q, nprobe=bad)
    for bad in (0, -0.1, 1.01, float("nan"), True, "0.9"):
        with pytest.raises(ValueError, match=r"recall_target must be a number in \(0, 1\]"):
            t.search(vector=q, recall_target=bad)


def test_table_without_a_law_falls_back_to_the_formula():
    x = _clusters(4000, scale=1.0, seed=13)
    t = Supertable.create("memory://calibrate/old", SCHEMA, vector_column="emb")
    t.append(_rows(x))
    # An older table: no law in its manifest.
    t.commit(CommitRequest(operation="forget law", set_properties={calibrate.LAW_PROPERTY: None},
                           replace_properties=(calibrate.LAW_PROPERTY,)))
    assert t.properties[calibrate.LAW_PROPERTY] is None
    n_cells = t.properties["grid"]["n_cells"]
    queries = x[:50] + 0.05
    default = t.search(vector=queries, k=10, columns=[])
    formula = t.search(vector=queries, k=10, columns=[],
                       nprobe=calibrate.fallback_nprobe(n_cells))
    assert default["_id"].to_pylist() == formula["_id"].to_pylist()


def test_merge_weights_the_curves_by_rows():
    def law(recall, rows):
        steps = calibrate.ladder(4)
        return calibrate.ProbeLaw(grid="g", n_cells=4, rows=rows, queries=100, nprobe=steps,
                                  recall=tuple(recall), stderr=(0.0,) * len(steps),
                                  prunable=(0.0,) * len(steps))

    merged = calibrate.merge(law([0.5, 0.7, 0.9, 1.0], 100), law([0.9, 1.0, 1.0, 1.0], 300),
                             100, 300)
    assert merged.rows == 400 and merged.queries == 200
    assert merged.recall == pytest.approx((0.8, 0.925, 0.975, 1.0))
    # A law of another grid is not merged.
    other = calibrate.merge(dataclass_replace(law([0.5] * 4, 100), grid="h"),
                            law([0.9, 1.0, 1.0, 1.0], 300), 100, 300)
    assert other.recall == (0.9, 1.0, 1.0, 1.0) and other.rows == 400


def dataclass_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


def test_due_after_growth_or_a_new_grid():
    law = calibrate.ProbeLaw(grid="g", n_cells=4, rows=1000, queries=10,
                             nprobe=(1, 2, 3, 4), recall=(0.5, 0.8, 0.9, 1.0),
                             stderr=(0.0,) * 4)
    assert calibrate.due(None, "g", 10)
    assert not calibrate.due(law, "g", 1999)
    assert calibrate.due(law, "g", 2000)
    assert calibrate.due(law, "h", 1001)


def test_filter_with_law_still_returns_k_rows():
    x = _clusters(5000, scale=1.0, seed=17)
    t = Supertable.create("memory://calibrate/filter", SCHEMA, vector_column="emb")
    t.append(_rows(x))
    got = t.search(vector=x[0], k=5, filter=pc.field("n") >= 4950)
    assert got.num_rows == 5 and all(n >= 4950 for n in got["n"].to_pylist())


# -- a commit rebuilt on a newer base (lost race, keyed mutation) ---------------

def _stale_pair(uri, rows=1000, **create):
    """Two handles on a table of ``rows`` rows with a law for them."""
    Supertable.create(uri, SCHEMA, vector_column="emb", **create).append(
        _rows(_clusters(rows, 2.0)))
    a, b = Supertable.open(uri), Supertable.open(uri)
    assert _law(a).rows == rows
    return a, b


def test_upsert_rebuilt_on_a_newer_base_still_stamps_the_law():
    """The keyed commit path rebuilds its request per base; the law must survive it."""
    a, b = _stale_pair("memory://calibrate/keyed-race", primary_key="n")
    a.upsert(_rows(_clusters(500, 2.0, seed=21), start=1000))     # 1,500 rows: no law due
    assert _law(a).rows == 1000
    # b read version 1: its upsert loses the race and is rebuilt on a's version,
    # where 1,500 + 1,000 rows are due a law.
    b.upsert(_rows(_clusters(1000, 2.0, seed=22), start=1500))
    t = Supertable.open("memory://calibrate/keyed-race")
    assert t.snapshot.totals["rows"] == 2500
    law = _law(t)
    assert law.rows == 2500 and law.grid == t.properties["grid"]["sha256"]
    assert t.history()[-1]["operation"] == "upsert"


def test_append_rebuilt_on_a_newer_base_merges_with_that_base():
    """A lost race recalibrates as a commit on the winner's version would."""
    a, b = _stale_pair("memory://calibrate/append-race")
    a.append(_rows(_clusters(500, 2.0, seed=23), start=1000))     # no law due
    b.append(_rows(_clusters(1000, 2.0, seed=24), start=1500))    # due on either base
    t = Supertable.open("memory://calibrate/append-race")
    # Merged with the law the winner's base holds, weighted by its 1,500 rows.
    assert _law(t).rows == t.snapshot.totals["rows"] == 2500


def test_append_rebuilt_where_no_law_is_due_keeps_the_winners_law():
    a, b = _stale_pair("memory://calibrate/append-race-kept")
    a.append(_rows(_clusters(3000, 2.0, seed=25), start=1000))    # recalibrates: 4,000 rows
    winner = a.properties[calibrate.LAW_PROPERTY]
    assert _law(a).rows == 4000
    # Due on b's stale base (1,000 -> 2,000 rows), not on a's (4,000 -> 5,000).
    b.append(_rows(_clusters(1000, 2.0, seed=26), start=4000))
    t = Supertable.open("memory://calibrate/append-race-kept")
    assert t.snapshot.totals["rows"] == 5000
    assert t.properties[calibrate.LAW_PROPERTY] == winner
