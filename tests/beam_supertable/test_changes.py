"""``Supertable.changes``: a range of versions as a retraction changelog."""

import collections
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable, VersionNotFoundError
from beam_supertable.errors import SchemaMismatchError

KEYED = pa.schema([("k", pa.int64()), ("v", pa.string())])
CHANGE_FIELDS = ["_change", "_version", "_commit_timestamp"]


def _uri():
    return f"memory://changes-{uuid.uuid4().hex}"


def _keyed(**kwargs):
    return Supertable.create(_uri(), KEYED, primary_key="k", iceberg=False, **kwargs)


def _rows(table):
    return [{k: r[k] for k in ("k", "v", "_change", "_version")} for r in table.to_pylist()]


def test_an_upsert_retracts_the_old_row_and_inserts_the_new_one_at_its_version():
    t = _keyed()
    t.upsert(pa.table({"k": [1, 2], "v": ["a", "b"]}))
    t.upsert(pa.table({"k": [2, 3], "v": ["B", "c"]}))
    assert _rows(t.changes(1)) == [
        {"k": 2, "v": "b", "_change": -1, "_version": 2},
        {"k": 2, "v": "B", "_change": 1, "_version": 2},
        {"k": 3, "v": "c", "_change": 1, "_version": 2}]


def test_a_delete_yields_retractions_and_an_append_insertions():
    t = Supertable.create(_uri(), KEYED, iceberg=False)
    t.append(pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]}))
    t.delete(pc.field("k") >= 2)
    out = t.changes(0)
    assert _rows(out) == [
        {"k": 1, "v": "a", "_change": 1, "_version": 1},
        {"k": 2, "v": "b", "_change": 1, "_version": 1},
        {"k": 3, "v": "c", "_change": 1, "_version": 1},
        {"k": 2, "v": "b", "_change": -1, "_version": 2},
        {"k": 3, "v": "c", "_change": -1, "_version": 2}]
    ids = out.column("_id").to_pylist()
    assert ids[3:] == ids[1:3]   # the retracted rows are the inserted ones, by _id


def test_optimize_and_vacuum_change_nothing():
    t = _keyed()
    for i in range(4):
        t.upsert(pa.table({"k": [i, i + 1], "v": [f"v{i}", f"w{i}"]}))
    before = t.version
    assert t.optimize() == before + 1
    t.vacuum(retain_versions=5, older_than=0)
    assert t.changes(before).num_rows == 0
    assert t.changes(before - 1).num_rows == t.checkout(before).changes(before - 1).num_rows


def test_the_result_has_the_commit_time_and_the_full_schema_even_when_empty():
    t = _keyed()
    t.upsert(pa.table({"k": [1], "v": ["a"]}))
    empty = t.changes(1)
    assert empty.num_rows == 0
    assert empty.schema.names == ["_id", "k", "v"] + CHANGE_FIELDS
    assert empty.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    when = t.changes(0).column("_commit_timestamp")[0].as_py()
    assert when.isoformat() == t.history()[-1]["timestamp"].replace("Z", "+00:00")


def test_columns_choose_what_each_change_carries():
    t = _keyed()
    t.upsert(pa.table({"k": [1], "v": ["a"]}))
    assert t.changes(0, columns=["v"]).schema.names == ["_id", "v"] + CHANGE_FIELDS
    with pytest.raises(SchemaMismatchError, match=r"unknown column\(s\) \['nope'\]"):
        t.changes(0, columns=["nope"])


def test_a_filter_keeps_matching_changes_and_skips_superfiles_by_statistics():
    t = _keyed()
    t.upsert(pa.table({"k": [1, 2], "v": ["a", "b"]}))
    t.upsert(pa.table({"k": [100, 101], "v": ["x", "y"]}))
    t.upsert(pa.table({"k": [1], "v": ["A"]}))
    fresh = Supertable.open(t.uri)
    got = fresh.changes(0, filter=pc.field("k") < 50)
    assert [(r["k"], r["v"], r["_change"]) for r in got.to_pylist()] == [
        (1, "a", 1), (2, "b", 1), (1, "a", -1), (1, "A", 1)]
    far = [e for e in fresh.superfiles() if e["keys"]["min"] == [100]]
    assert len(far) == 1 and fresh.cache.get(("reader", far[0]["path"])) is None


def test_bad_ranges_are_refused_with_the_versions_named():
    t = _keyed()
    for i in range(5):
        t.upsert(pa.table({"k": [i], "v": [str(i)]}))
    with pytest.raises(ValueError, match="start_version 4 is after end_version 2"):
        t.changes(4, 2)
    with pytest.raises(VersionNotFoundError, match="end_version 9 does not exist.*latest "
                                                   "version is 5"):
        t.changes(0, 9)
    with pytest.raises(ValueError, match="start_version must be an int >= 0"):
        t.changes(-1)
    t.vacuum(retain_versions=2, older_than=0)
    with pytest.raises(VersionNotFoundError,
                       match="version 1 was removed by vacuum; the oldest version still "
                             "readable is 4"):
        t.changes(1)
    assert t.changes(4).num_rows == 1


def test_reads_only_the_superfiles_and_row_groups_the_range_touched(tmp_path):
    schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("pad", pa.string())])
    t = Supertable.create(str(tmp_path / "t"), schema, primary_key="k", iceberg=False)
    rng = np.random.default_rng(0)
    for part in range(10):
        keys = list(range(part * 2000, part * 2000 + 2000))
        pads = [rng.bytes(100).hex() for _ in keys]   # incompressible: the bulk of the table
        t.append(pa.table({"k": keys, "v": ["a"] * len(keys), "pad": pads}))
    pad = pads[0]
    start = t.version
    t.upsert(pa.table({"k": [5, 19_999], "v": ["b", "b"], "pad": [pad, pad]}))
    total = sum(e["bytes"] for e in t.superfiles())
    fresh = Supertable.open(t.uri)
    out = fresh.changes(start, columns=["v"])
    assert [(r["v"], r["_change"]) for r in out.to_pylist()] == [
        ("a", -1), ("a", -1), ("b", 1), ("b", 1)]
    assert fresh.io.bytes < total / 10


# -- against the snapshots of every version ------------------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.dictionaries(st.integers(0, 7), st.integers(0, 3),
                                                 min_size=1, max_size=4)),
    st.tuples(st.just("append"), st.lists(st.integers(0, 3), min_size=1, max_size=3)),
    st.tuples(st.just("delete"), st.sets(st.integers(0, 7), min_size=1, max_size=3)),
    st.tuples(st.just("optimize"), st.none()),
), min_size=1, max_size=8)


def _apply(t, op, arg, keyed):
    if op == "upsert" and keyed:
        t.upsert(pa.table({"k": list(arg), "v": [str(v) for v in arg.values()]}, schema=KEYED))
    elif op in ("upsert", "append") and not keyed:
        keys = list(arg) if isinstance(arg, dict) else arg
        t.append(pa.table({"k": keys, "v": [str(k) for k in keys]}, schema=KEYED))
    elif op == "append":
        fresh = sorted({k + 10 for k in arg} - _live_keys(t))
        if fresh:
            t.append(pa.table({"k": fresh, "v": ["n"] * len(fresh)}, schema=KEYED))
    elif op == "delete":
        t.delete(pc.field("k").isin(sorted(arg)))
    else:
        t.optimize(target_file_bytes=1 << 20)


def _live_keys(t):
    return set(t.to_arrow(columns=["k"]).column("k").to_pylist())


def _snapshot(t, version, with_id):
    names = ["_id", "k", "v"] if with_id else ["k", "v"]
    return collections.Counter(tuple(r[n] for n in names)
                               for r in t.checkout(version).to_arrow(columns=names).to_pylist())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, keyed=st.booleans(), data=st.data())
def test_changes_replay_every_version_and_consolidate_to_the_snapshot_difference(
        ops, keyed, data):
    t = Supertable.create(_uri(), KEYED, primary_key="k" if keyed else None, iceberg=False)
    for op, arg in ops:
        _apply(t, op, arg, keyed)
    start = data.draw(st.integers(0, t.version), label="start")
    end = data.draw(st.integers(start, t.version), label="end")

    # Unconsolidated: replaying the changes on `start` gives every version up to `end`.
    live = {r["_id"]: (r["k"], r["v"])
            for r in t.checkout(start).to_arrow(columns=["_id", "k", "v"]).to_pylist()}
    by_version = collections.defaultdict(list)
    for r in t.changes(start, end).to_pylist():
        by_version[r["_version"]].append(r)
    for version in range(start + 1, end + 1):
        for r in by_version.pop(version, []):
            if r["_change"] < 0:
                assert live.pop(r["_id"]) == (r["k"], r["v"])
            else:
                assert r["_id"] not in live
                live[r["_id"]] = (r["k"], r["v"])
        assert collections.Counter((i,) + kv for i, kv in live.items()) \
            == _snapshot(t, version, with_id=True)
    assert not by_version

    # Consolidated: exactly rows(end) - rows(start), as multisets (per key on a
    # keyed table, whose rows are compared without their _id).
    before, after = _snapshot(t, start, not keyed), _snapshot(t, end, not keyed)
    names = ["k", "v"] if keyed else ["_id", "k", "v"]
    got = collections.Counter(
        (tuple(r[n] for n in names), r["_change"])
        for r in t.changes(start, end, consolidate=True).to_pylist())
    want = collections.Counter({(row, 1): n for row, n in (after - before).items()})
    want.update({(row, -1): n for row, n in (before - after).items()})
    assert got == want


def test_vector_and_text_tables_give_their_rows_back_exactly():
    schema = pa.schema([("k", pa.int64()), ("body", pa.string()),
                        ("emb", pa.list_(pa.float32(), 4))])
    t = Supertable.create(_uri(), schema, primary_key="k", vector_column="emb",
                          fts_columns=["body"], iceberg=False)
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(50, 4)).astype(np.float32)
    t.upsert(pa.table({"k": list(range(50)), "body": [f"doc {i}" for i in range(50)],
                       "emb": vectors.tolist()}, schema=schema))
    t.upsert(pa.table({"k": [7], "body": ["seven"], "emb": [[1, 2, 3, 4]]}, schema=schema))
    out = t.changes(1).to_pylist()
    assert [(r["k"], r["body"], r["emb"], r["_change"]) for r in out] == [
        (7, "doc 7", vectors[7].tolist(), -1), (7, "seven", [1.0, 2.0, 3.0, 4.0], 1)]


def test_a_keyed_row_rewritten_as_it_was_consolidates_to_nothing_nan_included():
    schema = pa.schema([("k", pa.int64()), ("x", pa.float64())])
    t = Supertable.create(_uri(), schema, primary_key="k", iceberg=False)
    t.upsert(pa.table({"k": [1, 2], "x": [float("nan"), 1.0]}, schema=schema))
    t.upsert(pa.table({"k": [1, 2], "x": [float("nan"), 2.0]}, schema=schema))
    t.upsert(pa.table({"k": [2], "x": [1.0]}, schema=schema))
    assert t.changes(1, consolidate=True).num_rows == 0
    assert t.changes(1).num_rows == 6


def test_mistaken_arguments_are_one_line_errors_before_anything_is_read():
    t = _keyed()
    t.upsert(pa.table({"k": [1], "v": ["a"]}))
    with pytest.raises(SchemaMismatchError, match="filter .* does not apply to the table's "
                                                  "columns"):
        t.changes(0, filter=pc.field("zz") > 1)
    with pytest.raises(TypeError, match="filter must be a pyarrow.compute.Expression"):
        t.changes(0, filter="k > 1")
    with pytest.raises(ValueError, match=r"column\(s\) \['v'\] asked for more than once"):
        t.changes(0, columns=["v", "v"])
    with pytest.raises(TypeError, match="columns must be a list of column names"):
        t.changes(0, columns=1)
    with pytest.raises(TypeError, match="consolidate must be True or False"):
        t.changes(0, consolidate="False")
    with pytest.raises(VersionNotFoundError, match="start_version 5 does not exist yet"):
        t.changes(5)
    assert t.changes(0, "latest").num_rows == 1


def test_a_filter_prunes_retractions_by_statistics_too(tmp_path):
    t = Supertable.create(str(tmp_path / "t"), KEYED, primary_key="k", iceberg=False)
    for part in range(4):
        t.upsert(pa.table({"k": list(range(part * 1000, part * 1000 + 1000)),
                           "v": ["a"] * 1000}))
    start = t.version
    t.upsert(pa.table({"k": [5, 3005], "v": ["b", "b"]}))
    fresh = Supertable.open(t.uri)
    got = fresh.changes(start, filter=pc.field("k") > 3000)
    assert [(r["k"], r["v"], r["_change"]) for r in got.to_pylist()] == [
        (3005, "a", -1), (3005, "b", 1)]
    low = [e for e in fresh.superfiles() if e["keys"]["max"] == [999]]
    assert len(low) == 1 and fresh.cache.get(("reader", low[0]["path"])) is None


def test_an_overwrite_that_changes_the_schema_names_the_versions_to_read():
    t = Supertable.create(_uri(), KEYED, iceberg=False)
    t.append(pa.table({"k": [1], "v": ["a"]}))
    other = pa.schema([("k", pa.int64())])
    t = Supertable.create(t.uri, other, mode="overwrite", iceberg=False)
    t.append(pa.table({"k": [2]}, schema=other))
    with pytest.raises(SchemaMismatchError, match=r"version 2 changed the table's schema.*"
                                                  r"read up to version 1, then from version 2"):
        t.changes(0)
    assert t.changes(0, 1).num_rows == 1 and t.changes(2).num_rows == 1
