"""``update(where, values)`` and ``restore(version)`` against a plain-Python
model; the change feed over a restore; refusals naming what is wrong."""

import collections
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import SchemaMismatchError, Supertable, VersionNotFoundError

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("ts", pa.int64())])


def _uri():
    return f"memory://update/{uuid.uuid4().hex}"


def as_table(rows):
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                     "v": pa.array([r[1] for r in rows], pa.int64()),
                     "ts": pa.array([r[2] for r in rows], pa.int64())})


def rows_of(table):
    return sorted((r["k"], r["v"], r["ts"]) for r in table.to_arrow(
        columns=["k", "v", "ts"]).to_pylist())


rows = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 3)), max_size=8,
                unique_by=lambda r: r[0])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=rows, keyed=st.booleans(), threshold=st.one_of(st.none(), st.integers(0, 9)),
       kind=st.sampled_from(["expr", "scalar", "both"]))
def test_update_equals_the_model(data, keyed, threshold, kind):
    t = Supertable.create(_uri(), SCHEMA, primary_key="k" if keyed else None)
    half = len(data) // 2
    for part in (data[:half], data[half:]):
        if part:
            t.append(as_table(part))
    before = t.version
    values = {"expr": {"v": pc.field("v") + pc.field("ts")}, "scalar": {"ts": 7},
              "both": {"v": pc.field("v") * 2, "ts": 7}}[kind]
    where = None if threshold is None else pc.field("v") > threshold
    result = t.update(where, values)
    want, hit = [], 0
    for k, v, ts in data:
        if threshold is None or v > threshold:
            hit += 1
            v, ts = {"expr": (v + ts, ts), "scalar": (v, 7), "both": (v * 2, 7)}[kind]
        want.append((k, v, ts))
    assert rows_of(t) == sorted(want)
    assert result.num_updated_rows == hit and result.num_inserted_rows == 0
    assert result.version == t.version == before + (1 if hit else 0)   # one commit, or none


def test_update_refuses_key_and_unknown_columns_and_bad_values():
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    t.append(as_table([(1, 1, 0)]))
    with pytest.raises(SchemaMismatchError, match="column 'k' is a primary-key column"):
        t.update(None, {"k": 2})
    with pytest.raises(SchemaMismatchError, match="column 'nope'"):
        t.update(None, {"nope": 2})
    with pytest.raises(SchemaMismatchError, match="column 'v'"):
        t.update(None, {"v": "not a number"})
    with pytest.raises(SchemaMismatchError, match="nope"):
        t.update(pc.field("nope") > 1, {"v": 2})
    assert t.refresh().version == 1 and rows_of(t) == [(1, 1, 0)]


def test_updating_a_vector_reindexes_it_and_the_feed_shows_retraction_and_insertion():
    schema = pa.schema([("k", pa.int64()), ("emb", pa.list_(pa.float32(), 2))])
    t = Supertable.create(_uri(), schema, primary_key="k", vector_column="emb")
    t.append(pa.table({"k": [1, 2, 3], "emb": [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]}))
    start = t.version
    r = t.update(pc.field("k") == 1, {"emb": pa.scalar([0.0, -1.0], schema.field("emb").type)})
    assert r.num_updated_rows == 1
    assert t.search(vector=[0.0, -1.0], k=1, columns=["k"]).column("k").to_pylist() == [1]
    feed = t.changes(start).to_pylist()
    assert sorted((c["_change"], c["k"], tuple(c["emb"])) for c in feed) == [
        (-1, 1, (1.0, 0.0)), (1, 1, (0.0, -1.0))]


def _net(feed):
    net = collections.Counter()
    for c in feed:
        net[(c["k"], c["v"], c["ts"])] += c["_change"]
    return {r: n for r, n in net.items() if n}


ops = st.lists(st.tuples(st.sampled_from(["upsert", "delete", "update"]), rows), min_size=1,
               max_size=4)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=rows, steps=ops, pick=st.integers(0, 10), optimize=st.booleans())
def test_restore_brings_back_the_rows_and_the_feed_over_it_is_the_diff(first, steps, pick,
                                                                      optimize):
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    t.upsert(as_table(first))
    for op, data in steps:
        if op == "upsert":
            t.upsert(as_table(data))
        elif op == "delete":
            t.delete(pc.field("k").isin([r[0] for r in data]))
        else:
            t.update(pc.field("k").isin([r[0] for r in data]), {"ts": 9})
    if optimize:
        t.optimize()
    target = pick % (t.version + 1)
    old, before = rows_of(t.checkout(target)), rows_of(t)
    history = t.history()
    version = t.restore(target)
    assert rows_of(t) == old
    assert rows_of(t.checkout(target)) == old          # older versions still read their rows
    assert t.history()[:len(history)] == history       # a commit, not a rewind
    if old == before:
        return
    assert version == history[-1]["version"] + 1 and t.history()[-1]["operation"] == "restore"
    want = collections.Counter(old)
    want.subtract(collections.Counter(before))
    assert _net(t.changes(version - 1).to_pylist()) == {r: n for r, n in want.items() if n}
    # Rows live on both sides stay as they are: nothing retracted comes back.
    feed = t.changes(version - 1)
    gone = set(feed.filter(pc.equal(feed["_change"], -1)).column("_id").to_pylist())
    back = set(feed.filter(pc.equal(feed["_change"], 1)).column("_id").to_pylist())
    assert not gone & back


def test_restore_keeps_consumers_and_tokens_and_refuses_unknown_or_vacuumed_versions(tmp_path):
    t = Supertable.create(str(tmp_path / "t"), SCHEMA)
    t.append(as_table([(1, 1, 0)]), token="a")
    t.append(as_table([(2, 2, 0)]), token="b")
    t.changes(0, consumer="reader")
    v = t.restore(1)
    assert rows_of(t) == [(1, 1, 0)]
    assert [c.name for c in t.consumers()] == ["reader"]
    assert t.append(as_table([(2, 2, 0)]), token="b") == 2   # the token is still remembered
    with pytest.raises(VersionNotFoundError, match="cannot restore version 42"):
        t.restore(42)
    t.drop_consumer("reader")
    t.vacuum(retain_versions=1, older_than=0)
    with pytest.raises(VersionNotFoundError, match="cannot restore version 1"):
        t.restore(1)
    assert t.refresh().version == v and rows_of(t) == [(1, 1, 0)]
    assert np.all(np.diff([h["version"] for h in t.history()]) == 1)


def test_restore_brings_back_the_old_schema_with_its_rows(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="k")
    t.append(as_table([(1, 1, 0), (2, 2, 0)]))
    other = pa.schema([("k", pa.int64()), ("w", pa.string())])
    t = Supertable.create(uri, other, primary_key="k", mode="overwrite")
    t.append(pa.table({"k": [5], "w": ["x"]}))
    t.restore(1)
    assert t.user_schema.names == SCHEMA.names and rows_of(Supertable.open(uri)) == [(1, 1, 0), (2, 2, 0)]
    assert Supertable.open(uri, version=3).to_arrow(columns=["k", "w"]).to_pylist() == [
        {"k": 5, "w": "x"}]
    t.upsert(as_table([(2, 20, 1)]))                 # the keys hold: one live row per key
    assert rows_of(t) == [(1, 1, 0), (2, 20, 1)]


def test_restore_across_a_dropped_and_added_again_column_brings_its_values_back():
    # The schema after the drop and the add has the same names and types as
    # the restored version's; only the field id of "ts" differs.
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    t.append(as_table([(1, 1, 5), (2, 2, 6)]))
    t.drop_columns("ts")
    t.add_columns(pa.field("ts", pa.int64()))
    assert rows_of(t) == [(1, 1, None), (2, 2, None)]
    t.restore(1)
    assert rows_of(t) == rows_of(t.checkout(1)) == [(1, 1, 5), (2, 2, 6)]


def test_the_feed_over_a_restore_that_narrows_a_column_refuses_naming_the_version():
    t = Supertable.create(_uri(), pa.schema([("k", pa.int64()), ("v", pa.int32())]),
                          primary_key="k")
    t.append(pa.table({"k": [1], "v": pa.array([1], pa.int32())}))     # version 1
    t.alter_column("v", pa.int64())
    t.upsert(pa.table({"k": [2], "v": [2**40]}))                       # version 3
    t.restore(1)                                                        # v is int32 again
    assert t.to_arrow(columns=["k", "v"]).to_pylist() == [{"k": 1, "v": 1}]
    with pytest.raises(SchemaMismatchError, match=r"version 4 .*column 'v'"):
        t.changes(3, 4)
    assert t.changes(2, 3).column("v").to_pylist() == [2**40]


def test_a_restore_that_changes_the_schema_is_in_the_schema_history():
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    t.append(as_table([(1, 1, 0)]))
    t.add_columns(pa.field("u", pa.string()))
    t.restore(1)
    assert t.properties["schema_history"][-1] == {
        "version": 3, "change": "restore the schema of version 1"}


def test_update_and_restore_from_a_handle_older_than_a_schema_change():
    uri = _uri()
    t = Supertable.create(uri, SCHEMA, primary_key="k")
    t.append(as_table([(1, 1, 0), (2, 2, 0)]))
    stale, other = Supertable.open(uri), Supertable.open(uri)
    other.add_columns(pa.field("unit", pa.string()))
    other.upsert(pa.table({"k": [1], "v": [1], "ts": [0], "unit": ["C"]}))
    stale.update(pc.field("k") == 1, {"v": 10})      # "unit" keeps its value
    assert Supertable.open(uri).to_arrow(columns=["k", "v", "unit"]).sort_by("k").to_pylist() \
        == [{"k": 1, "v": 10, "unit": "C"}, {"k": 2, "v": 2, "unit": None}]
    old = Supertable.open(uri, version=1)
    old.restore(1)                                    # the schema of version 1 comes back
    assert Supertable.open(uri).schema.names == ["_id", "k", "v", "ts"]
    assert rows_of(Supertable.open(uri)) == [(1, 1, 0), (2, 2, 0)]
