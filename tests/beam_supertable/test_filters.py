"""Statistics pruning: exact, sound for any filter, bounded in size, compatible with old entries."""

import datetime
import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import ReadFromSupertable, Supertable
from beam_supertable.format.filters import (
    STRING_STATS_BYTES, Pruner, column_stats, mask, may_match, null_counts, truncate_max,
    truncate_min)

BIG = 2**60 + 1          # float(BIG) == 2**60: a float parse loses it
U64_MAX = 2**64 - 1


# -- exact integers, end to end -------------------------------------------------
@pytest.fixture
def big_ints(table_location):
    """Three superfiles; the middle one holds only ``BIG`` and the largest uint64."""
    uri, options = table_location
    schema = pa.schema([("x", pa.int64()), ("u", pa.uint64()), ("tag", pa.string())])
    t = Supertable.create(uri, schema, storage_options=options)
    t.append(pa.table({"x": [1, 2], "u": pa.array([1, 2], pa.uint64()), "tag": ["a", "b"]}))
    t.append(pa.table({"x": [BIG], "u": pa.array([U64_MAX], pa.uint64()), "tag": ["big"]}))
    t.append(pa.table({"x": [BIG + 10, -BIG], "u": pa.array([5, 3], pa.uint64()),
                       "tag": ["bigger", "negative"]}))
    return Supertable.open(uri, storage_options=options)


def test_int64_beyond_2_53_is_found_counted_and_read(big_ints):
    t = big_ints
    x = pc.field("x")
    assert t.count_rows(x == BIG) == 1
    assert t.to_arrow(columns=["tag"], filter=x == BIG)["tag"].to_pylist() == ["big"]
    assert t.count_rows(x == -BIG) == 1
    assert t.count_rows(pc.scalar(BIG) == x) == 1          # the field on the right
    assert t.count_rows(x >= BIG) == 2
    assert t.count_rows(x.isin([BIG, 7])) == 1
    assert t.count_rows(pc.field("u") == pc.scalar(pa.scalar(U64_MAX, pa.uint64()))) == 1


def test_int64_beyond_2_53_is_read_by_the_beam_source(big_ints):
    t = big_ints
    with TestPipeline() as p:
        rows = p | ReadFromSupertable(t.uri, columns=["tag"], filter=pc.field("x") == BIG,
                                      storage_options=t.store.storage_options)
        assert_that(rows | beam.Map(lambda r: r["tag"]), equal_to(["big"]))


def test_delete_by_an_int64_beyond_2_53_deletes_it(big_ints):
    t = big_ints
    t.delete(pc.field("x") == BIG)
    assert t.count_rows(pc.field("x") == BIG) == 0
    assert sorted(t.to_arrow(columns=["tag"])["tag"].to_pylist()) == [
        "a", "b", "bigger", "negative"]


def test_id_filters_prune_by_the_id_range(big_ints):
    t = big_ints
    entries = t.superfiles()
    ids = t.to_arrow(columns=["_id", "tag"])
    big_id = ids.filter(pc.field("tag") == "big")["_id"][0].as_py()
    for expr in (pc.field("_id") == big_id, pc.field("_id").isin([big_id]),
                 (pc.field("_id") >= big_id) & (pc.field("_id") <= big_id)):
        keep = Pruner(expr, t.schema)
        assert sum(keep(e) for e in entries) == 1, expr
        assert t.to_arrow(columns=["tag"], filter=expr)["tag"].to_pylist() == ["big"]
    # A handle that prunes reads only the superfile holding the id.
    cold = Supertable.open(t.uri, storage_options=t.store.storage_options)
    cold.count_rows(pc.field("_id") == big_id)
    one = cold.io.snapshot()["bytes"]
    cold = Supertable.open(t.uri, storage_options=t.store.storage_options)
    cold.count_rows(pc.field("_id") != big_id)
    assert one < cold.io.snapshot()["bytes"]


# -- statistics ----------------------------------------------------------------
def test_string_statistics_are_truncated_and_still_prune_correctly(tmp_path):
    schema = pa.schema([("body", pa.string())])
    t = Supertable.create(str(tmp_path / "t"), schema, fts_columns=["body"])
    shared = "x" * 100
    docs = [shared + " first " + "a" * 10_000, shared + " second " + "b" * 10_000]
    t.append(pa.table({"body": docs}))
    t.append(pa.table({"body": ["zzz"]}))
    entry = t.superfiles()[0]
    assert len(json.dumps(entry["stats"])) < 4 * STRING_STATS_BYTES
    lo, hi = entry["stats"]["body"]
    assert len(lo.encode()) <= STRING_STATS_BYTES and len(hi.encode()) <= STRING_STATS_BYTES
    for doc in docs:  # truncated bounds are bounds: equality past the prefix still finds it
        assert t.to_arrow(columns=["body"], filter=pc.field("body") == doc)["body"].to_pylist() == [doc]
    assert t.count_rows((pc.field("body") > shared) & (pc.field("body") < "y")) == 2
    assert not may_match(entry, pc.field("body") == "zzz", t.schema)
    assert not may_match(entry, pc.field("body") < "x", t.schema)


@given(st.text(max_size=120), st.integers(min_value=1, max_value=80))
def test_truncated_string_bounds_are_bounds(value, limit):
    lo, hi = truncate_min(value, limit), truncate_max(value, limit)
    assert len(lo.encode()) <= limit and lo <= value
    assert hi is None or (len(hi.encode()) <= limit and value <= hi)
    if len(value.encode()) <= limit:
        assert lo == hi == value


def test_truncation_steps_over_code_points_that_cannot_grow():
    assert truncate_max("ab" + "\U0010FFFF" * 30, 8) == "ac"
    assert truncate_max("\U0010FFFF" * 30, 8) is None
    assert truncate_max("a\ud7ff" + "z" * 20, 4) == "a\ue000"
    assert truncate_min("é" * 40, 5) == "éé"


def test_nanosecond_timestamps_and_dates_append_and_prune(tmp_path):
    day = datetime.datetime(2024, 5, 1)
    schema = pa.schema([("ts", pa.timestamp("ns")), ("d", pa.date32()),
                        ("zoned", pa.timestamp("us", "UTC"))])
    t = Supertable.create(str(tmp_path / "t"), schema)
    t.append(pa.table({"ts": pa.array([1, 2], pa.int64()).cast(pa.timestamp("ns")),
                       "d": [datetime.date(1970, 1, 1)] * 2,
                       "zoned": pa.array([0, 1], pa.timestamp("us", "UTC"))}))
    t.append(pa.table({"ts": pa.array([day], pa.timestamp("ns")), "d": [day.date()],
                       "zoned": pa.array([day], pa.timestamp("us", "UTC"))}))
    entries = t.superfiles()
    two_ns = pc.scalar(pa.scalar(2, pa.timestamp("ns")))
    assert t.count_rows(pc.field("ts") == two_ns) == 1
    assert [may_match(e, pc.field("ts") == two_ns, t.schema) for e in entries] == [True, False]
    assert [may_match(e, pc.field("ts") >= day, t.schema) for e in entries] == [False, True]
    assert [may_match(e, pc.field("d") < day.date(), t.schema) for e in entries] == [True, False]
    assert [may_match(e, pc.field("d") >= day, t.schema) for e in entries] == [False, True]
    zoned_day = pc.scalar(pa.scalar(day, pa.timestamp("s", "UTC")))
    assert [may_match(e, pc.field("zoned") == zoned_day, t.schema) for e in entries] == [False, True]
    assert t.count_rows(pc.field("zoned") == zoned_day) == 1


def test_infinite_floats_append_and_prune(tmp_path):
    t = Supertable.create(str(tmp_path / "t"), pa.schema([("f", pa.float64())]))
    t.append(pa.table({"f": [-np.inf, 0.5]}))
    t.append(pa.table({"f": [np.inf, 2.0]}))
    first, second = t.superfiles()
    assert t.count_rows(pc.field("f") > 1e308) == 1
    assert t.count_rows(pc.field("f") < -1e308) == 1
    assert [may_match(e, pc.field("f") == 0.5, t.schema) for e in (first, second)] == [True, False]
    assert [may_match(e, pc.field("f") < 1.0, t.schema) for e in (first, second)] == [True, False]


def test_entries_of_older_tables_are_read_as_the_bounds_they_are():
    schema = pa.schema([("x", pa.int64()), ("f", pa.float64()), ("s", pa.string()),
                        ("t", pa.timestamp("us")), ("d", pa.date32())])
    old = {"id": "e", "rows": 3, "id_min": 10, "id_max": 12, "stats": {
        "x": [1, 9], "f": [1.0, 5.0], "s": ["apple", "zebra"],
        "t": ["2020-01-01T00:00:00", "2020-12-31T00:00:00.000500"], "d": ["2020-01-01", "2020-01-31"]}}

    def keep(expr):
        return may_match(old, expr, schema)

    assert keep(pc.field("x") == 9) and not keep(pc.field("x") == 10)
    assert keep(pc.field("f") > 4.5) and not keep(pc.field("f") > 5.0)
    assert not keep(pc.field("s") > "zz") and keep(pc.field("s") == "mango")
    assert keep(pc.field("t") == datetime.datetime(2020, 12, 31, 0, 0, 0, 500))
    assert not keep(pc.field("t") > datetime.datetime(2020, 12, 31, 0, 0, 0, 501))
    assert not keep(pc.field("d") > datetime.date(2020, 1, 31))
    # Old entries carry no null counts and may hide NaN: nothing is assumed.
    assert keep(pc.field("x").is_null()) and keep(~(pc.field("f") > 0.0))


def test_unknown_or_unreadable_filters_keep_every_superfile():
    entry = {"rows": 2, "stats": {"x": [1, 2]}, "null_counts": {}, "id_min": 1, "id_max": 2}
    for expr in (pc.field("x") < pc.field("y"), pc.field("x").cast(pa.int8()) == 9,
                 pc.field(0) == 9, pc.field("s", "inner") == 9, pc.field("x") + 1 == 100,
                 pc.field("x") > pc.scalar(pa.scalar(1, pa.decimal128(5, 2)))):
        assert may_match(entry, expr)
    assert may_match({"rows": 1, "stats": {"x": "not a pair"}}, pc.field("x") == 9)


# -- soundness: a property against the rows themselves ---------------------------
COLUMNS = {
    "i": pa.int64(), "f": pa.float64(), "s": pa.string(), "b": pa.bool_(),
    "t": pa.timestamp("ns"),
}
SCHEMA = pa.schema([("_id", pa.int64())] + [(n, ty) for n, ty in COLUMNS.items()])
INTS = st.sampled_from([-BIG, -5, 0, 1, 2, 3, 2**53, 2**53 + 1, BIG, BIG + 1, 2**63 - 1])
FLOATS = st.sampled_from([-np.inf, -1.5, 0.0, 0.5, 2.0, 2.0**53, np.inf, np.nan])
STRS = st.sampled_from(["", "a", "ab", "b", "x" * 70, "x" * 70 + "a", "x" * 70 + "b", "é" * 40])
TIMES = st.sampled_from([0, 1, 999, 10**15, 10**18])
VALUES = {"i": INTS, "f": FLOATS, "s": STRS, "b": st.booleans(), "t": TIMES}


def _literal(name, value):
    if name == "t":
        return pc.scalar(pa.scalar(value, pa.timestamp("ns")))
    if name == "i":
        return pc.scalar(pa.scalar(value, pa.int64()))
    return pc.scalar(value)


@st.composite
def expressions(draw, depth=0):
    name = draw(st.sampled_from(sorted(COLUMNS) + ["_id"]))
    values = VALUES.get(name, st.integers(min_value=0, max_value=12))
    field = pc.field(name)
    kind = draw(st.sampled_from(["cmp", "cmp", "cmp", "isin", "null", "valid", "bool"]
                                + (["and", "or", "not", "xor"] if depth < 2 else [])))
    if kind == "cmp":
        op = draw(st.sampled_from(["equal", "not_equal", "less", "less_equal", "greater",
                                   "greater_equal"]))
        lit = _literal(name, draw(values))
        args = [lit, field] if draw(st.booleans()) else [field, lit]
        return getattr(pc, op)(*args)
    if kind == "isin":
        vals = draw(st.lists(values, max_size=4))
        return field.isin(pa.array(vals, SCHEMA.field(name).type))
    if kind == "null":
        return field.is_null()
    if kind == "valid":
        return field.is_valid()
    if kind == "bool":
        return pc.field("b")
    a, b = draw(expressions(depth + 1)), draw(expressions(depth + 1))
    return {"and": a & b, "or": a | b, "not": ~a, "xor": pc.xor(a, b)}[kind]


@st.composite
def superfiles(draw):
    n = draw(st.integers(min_value=1, max_value=5))
    cols = {name: draw(st.lists(st.one_of(st.none(), VALUES[name]), min_size=n, max_size=n))
            for name in COLUMNS}
    first = draw(st.integers(min_value=0, max_value=8))
    cols["_id"] = list(range(first, first + n))
    return pa.table({name: pa.array(cols[name], SCHEMA.field(name).type) for name in SCHEMA.names})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(superfiles(), expressions())
def test_pruning_never_drops_a_superfile_holding_a_match(rows, expr):
    user = rows.drop_columns(["_id"])
    entry = {"rows": rows.num_rows, "stats": column_stats(user), "null_counts": null_counts(user),
             "id_min": min(rows["_id"].to_pylist()), "id_max": max(rows["_id"].to_pylist())}
    json.dumps(entry, allow_nan=False)  # persisted as strict JSON
    matches = mask(rows, expr).any()
    if matches:
        assert Pruner(expr, SCHEMA)(entry), (expr, rows.to_pylist(), entry)
        assert Pruner(expr)(entry), (expr, rows.to_pylist(), entry)


@pytest.mark.parametrize("expr,expected", [
    (pc.field("i") == 4, False), (pc.field("i") == 3, True), (pc.field("i") > 3, False),
    (~(pc.field("i") >= 1), False), (pc.field("i").isin([0, 4]), False),
    (pc.field("i").is_null(), True), (pc.field("f").is_null(), False),
    (pc.field("f").is_valid(), True), (pc.field("s").is_valid(), False),
    (pc.field("s") == "a", False), ((pc.field("i") == 4) | (pc.field("i") == 2), True),
    ((pc.field("i") == 2) & (pc.field("f") > 9.0), False), (pc.field("b"), False),
    (~pc.field("b"), True), (pc.scalar(3) < pc.field("i"), False),
    (pc.field("i") == pc.scalar(pa.scalar(None, pa.int64())), False),
])
def test_pruning_decides_what_the_statistics_decide(expr, expected):
    rows = pa.table({"i": pa.array([1, 3, None], pa.int64()), "f": [0.5, 1.0, 2.0],
                     "s": pa.array([None] * 3, pa.string()), "b": [False, False, None]})
    entry = {"rows": 3, "stats": column_stats(rows), "null_counts": null_counts(rows)}
    assert Pruner(expr, SCHEMA)(entry) is expected


# -- is_in casts its value set to the column's type --------------------------------
def test_isin_float_set_on_float32_column_finds_the_row(local_uri):
    """Arrow casts an is_in value set to the column's type (float64 0.1 -> float32 0.1)."""
    t = Supertable.create(local_uri, pa.schema([("f", pa.float32()), ("tag", pa.string())]))
    t.append(pa.table({"f": pa.array([0.1], pa.float32()), "tag": ["x"]}))
    expr = pc.field("f").isin([0.1])
    # Arrow's own answer on the same rows.
    assert t.to_arrow(columns=["f"]).filter(expr).num_rows == 1
    assert t.count_rows(expr) == 1
    assert t.to_arrow(columns=["tag"], filter=expr)["tag"].to_pylist() == ["x"]
    t.delete(expr)
    assert t.count_rows() == 0


def test_isin_timestamp_set_on_date_column_finds_the_row(local_uri):
    """Arrow casts a timestamp value set to date32 (dropping the time of day) for is_in."""
    t = Supertable.create(local_uri, pa.schema([("d", pa.date32())]))
    t.append(pa.table({"d": pa.array([datetime.date(2024, 1, 1)])}))
    expr = pc.field("d").isin(pa.array([datetime.datetime(2024, 1, 1, 5)], pa.timestamp("us")))
    assert t.to_arrow(columns=["d"]).filter(expr).num_rows == 1
    assert t.count_rows(expr) == 1
