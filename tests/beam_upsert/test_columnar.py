"""The columnar path: kernel details, partitioning and bad batches."""

import itertools
from decimal import Decimal

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from beam_upsert import Upsert, UpsertBatches, batches_to_changes, upsert_table
from beam_upsert.columnar import partition_of
from tests.beam_upsert.helpers import _Stamp, _WithTime, counters
from tests.beam_upsert.reference import reference


def test_kernel_accepts_timestamp_time_and_resume():
    t = pa.table({
        "id": pa.array([1, 1, 2]),
        "v": pa.array(["a", "b", "c"]),
        "o": pa.array([1, 2, 3]),
        "ts": pa.array([0, 2_000_000, 1_000_000], pa.timestamp("us")),
    })
    out = upsert_table(t, key="id", value="v", offset="o", time="ts", resume_at=1_000_000)
    assert out.to_pylist() == [
        {"key": 1, "value": "b", "diff": 1, "time": 2_000_000},
        {"key": 2, "value": "c", "diff": 1, "time": 1_000_000},
    ]


def test_partition_of_is_deterministic_and_balanced():
    keys = pa.array([f"user-{i}" for i in range(20_000)])
    parts = partition_of(keys, 16)
    assert np.array_equal(parts, partition_of(keys, 16))
    counts = np.bincount(parts, minlength=16)
    assert counts.min() > 0.7 * counts.mean(), counts
    ints = partition_of(pa.array(np.arange(20_000)), 16)
    assert np.bincount(ints, minlength=16).min() > 0.7 * 20_000 / 16
    # A sliced array hashes its own rows, not the parent's.
    assert np.array_equal(partition_of(keys.slice(5, 10), 16), parts[5:15])


def test_bad_batches_and_rows_go_to_invalid():
    good = pa.table({"key": ["a", None], "value": [1, 2], "offset": [1, 2], "time": [0, 0]})
    missing = pa.table({"key": ["b"], "value": [1]})
    p = TestPipeline()
    result = (p | beam.Create([good, missing])
              | UpsertBatches().with_invalid_output())
    rows = result.changes | beam.ParDo(batches_to_changes())
    assert_that(rows, equal_to([("a", 1, 1)]), label="changes")

    def check(invalid):
        reasons = sorted(i.reason for i in invalid)
        if len(reasons) != 2 or "lacks column" not in reasons[0] or "null" not in reasons[1]:
            raise BeamAssertException(f"unexpected invalid output {invalid}")

    assert_that(result.invalid, check, label="invalid")
    res = p.run()
    res.wait_until_finish()
    got = counters(res)
    assert got["invalid"] == 2
    assert got["inserts"] == 1


def test_batches_keep_the_row_api_key_and_time_rules():
    """In a pipeline too: -0.0 and 0.0 are two keys (Beam groups by encoded
    bytes), and a NaN key or a time that is not whole microseconds sends its
    row, not its batch, to ``invalid`` with a reason naming it."""
    commands = pa.table({
        "key": [-0.0, 0.0, float("nan"), 2.0, 3.0],
        "value": ["a", "b", "c", "d", "e"],
        "offset": [1, 1, 1, 1, 1],
        "time": pa.array([1000, 2000, 3000, 4001, 5000], pa.timestamp("ns"))})
    prior = pa.table({"key": [0.0], "value": ["p"]})
    p = TestPipeline()
    result = (p | "Cmds" >> beam.Create([commands])
              | UpsertBatches(prior=p | "Prior" >> beam.Create([prior]), n_partitions=2)
              .with_invalid_output())
    rows = result.changes | beam.ParDo(batches_to_changes()) | beam.Map(
        lambda c: (repr(c.key), c.value, c.diff))   # repr tells -0.0 from 0.0
    assert_that(rows, equal_to([("-0.0", "a", 1), ("0.0", "p", -1), ("0.0", "b", 1),
                                ("3.0", "e", 1)]), label="changes")
    assert_that(result.invalid | beam.Map(lambda i: i.reason), equal_to(
        ["key nan is not a finite float",
         "time 4001 ns is not a whole number of microseconds"]), label="invalid")
    p.run().wait_until_finish()


def _rows(table):
    return sorted(((r["key"], r["value"], r["diff"], r["time"]) for r in table.to_pylist()),
                  key=repr)


def _commands(rows, offset_type=pa.int64()):
    return pa.table({
        "key": pa.array([r[0] for r in rows], pa.string()),
        "value": pa.array([r[1] for r in rows], pa.int64()),
        "offset": pa.array([r[2] for r in rows], offset_type),
        "time": pa.array([r[3] for r in rows], pa.int64()),
    })


def test_equal_offsets_pick_the_row_api_winner_whatever_the_row_order():
    rows = [("k", 7, 3, 0), ("k", None, 3, 0), ("k", 10, 3, 0), ("k", 9, 3, 0),
            ("k", 99, 2, 0), ("j", None, 1, 0), ("j", 4, 1, 0), ("j", 5, 0, 1)]
    expected = reference(rows)[0]
    assert ("k", 9, 1, 0) in expected  # repr "9" > "7" > "10"; a value beats a delete
    for order in itertools.permutations(range(len(rows)), 3):
        shuffled = [rows[i] for i in order] + [r for i, r in enumerate(rows) if i not in order]
        assert _rows(upsert_table(_commands(shuffled))) == expected, shuffled


def test_duplicate_snapshot_keys_are_reported_not_resolved_by_arrival_order():
    commands = _commands([("k", 5, 1, 0), ("u", 1, 1, 0)])
    snapshot = [("k", 1), ("k", 3), ("k", 1), ("x", 8), ("x", 9)]  # x: no command touches it
    expected, refused = reference([("k", 5, 1, 0), ("u", 1, 1, 0)], snapshot)
    assert refused == [("k", 1), ("k", 1)]
    for order in (snapshot, snapshot[::-1]):
        prior = pa.table({"key": [k for k, _ in order], "value": [v for _, v in order]})
        got = upsert_table(commands, prior, with_invalid=True)
        assert _rows(got.changes) == expected
        assert sorted((i.element["key"], i.element["value"]) for i in got.invalid) == refused
        assert all("more than once" in i.reason and "kept 3" in i.reason for i in got.invalid)

        p = TestPipeline()
        result = (p | "Cmds" >> beam.Create([commands])
                  | UpsertBatches(prior=p | "Prior" >> beam.Create(
                      [prior.slice(0, 2), prior.slice(2)]), n_partitions=2)
                  .with_invalid_output())
        assert_that(result.changes | beam.ParDo(batches_to_changes()),
                    equal_to([(k, v, d) for k, v, d, _ in expected]), label="changes")
        assert_that(result.invalid | beam.Map(lambda i: (i.element["key"], i.element["value"])),
                    equal_to(refused), label="invalid")
        p.run().wait_until_finish()


def test_batches_of_different_offset_classes_do_not_fail_the_job():
    ints = [("k", 1, 5, 0), ("k", 3, 7, 1), ("n", 1, 1, 0)]
    strs = [("k", 2, "6", 0), ("k", 4, "8", 2), ("s", 2, "1", 0)]
    # Numbers all, but Arrow merges neither decimals nor booleans with int64.
    decimals = [("k", 5, Decimal("7.5"), 1), ("d", 1, Decimal(1), 0)]
    bools = [("n", 9, True, 0)]
    small_ints = [("n", 2, 2, 1)]
    expected, refused = reference(ints + strs + decimals + bools + small_ints)
    assert refused == [("k", 2, "6"), ("k", 4, "8")]
    assert ("k", 5, 1, 1) in expected and ("n", 9, 1, 0) in expected

    def batch(rows, offset_type=pa.int64()):
        return _commands([(k, v, o, t * 1_000_000) for k, v, o, t in rows], offset_type)

    p = TestPipeline()
    result = (p | beam.Create([batch(ints), batch(strs, pa.string()),
                               batch(decimals, pa.decimal128(5, 1)), batch(bools, pa.bool_()),
                               batch(small_ints, pa.int8())])
              | UpsertBatches(n_partitions=1).with_invalid_output())
    assert_that(result.changes | beam.ParDo(batches_to_changes()) | beam.ParDo(_WithTime()),
                equal_to(expected), label="changes")

    def check(invalid):
        got = sorted(((i.element["key"], i.element["value"], i.element["offset"])
                      for i in invalid), key=repr)
        if got != refused or not all("does not order" in i.reason for i in invalid):
            raise BeamAssertException(f"unexpected invalid output {invalid}")

    assert_that(result.invalid, check, label="invalid")
    res = p.run()
    res.wait_until_finish()
    assert counters(res)["invalid"] == 2


def test_offsets_without_an_order_are_refused():
    nan = _commands([("k", 1, 1.0, 0), ("k", 2, float("nan"), 0), ("j", 3, 2.0, 0)],
                    pa.float64())
    got = upsert_table(nan, with_invalid=True)
    assert _rows(got.changes) == [("j", 3, 1, 0), ("k", 1, 1, 0)]
    assert [i.reason for i in got.invalid] == ["offset is NaN, which is not orderable"]
    structs = pa.table({"key": ["k"], "value": [1], "offset": [{"a": 1}], "time": [0]})
    with pytest.raises(TypeError, match="'offset' must hold offsets that order"):
        upsert_table(structs)

    p = TestPipeline()
    result = p | beam.Create([nan, structs]) | UpsertBatches().with_invalid_output()
    assert_that(result.changes | beam.ParDo(batches_to_changes()),
                equal_to([("j", 3, 1), ("k", 1, 1)]), label="changes")
    assert_that(result.invalid | beam.Map(lambda i: i.reason.split(":")[0][:25]),
                equal_to(["offset is NaN, which is n", "column 'offset' must hold"]),
                label="invalid")
    p.run().wait_until_finish()


def test_int_resume_at_is_microseconds_in_every_entry_point():
    rows = [("k", 1, 1, 3_000_000), ("k", 2, 2, 5_000_000), ("j", 3, 3, 4_000_000)]
    expected = [("k", 2, 1, 5_000_000)]
    assert _rows(upsert_table(_commands(rows), resume_at=5_000_000)) == expected
    assert _rows(upsert_table(_commands(rows), resume_at=Timestamp(5))) == expected

    p = TestPipeline()
    batches = p | "Batches" >> beam.Create([_commands(rows)])
    columnar = (batches | UpsertBatches(resume_at=5_000_000)
                | beam.ParDo(batches_to_changes()) | "TB" >> beam.ParDo(_WithTime()))
    assert_that(columnar, equal_to([("k", 2, 1, 5)]), label="columnar")
    cmds = (p | "Cmds" >> beam.Create([((k, v, o), t / 1e6) for k, v, o, t in rows])
            | beam.ParDo(_Stamp()))
    for flavor in ("grouped", "stateful"):
        out = cmds | flavor >> Upsert(flavor, resume_at=5_000_000)
        assert_that(out | f"T{flavor}" >> beam.ParDo(_WithTime()),
                    equal_to([("k", 2, 1, 5)]), label=flavor)
    p.run().wait_until_finish()

    for make in (lambda: upsert_table(_commands(rows), resume_at=5.0),
                 lambda: UpsertBatches(resume_at=5.0), lambda: Upsert(resume_at=5.0)):
        with pytest.raises(TypeError, match="microseconds"):
            make()


def test_batches_whose_types_do_not_merge_are_refused_not_fatal():
    good = _commands([("a", 1, 1, 0), ("b", 2, 2, 0), ("c", 3, 3, 0)])
    strings = pa.table({"key": ["a"], "value": ["x"], "offset": [9], "time": [0]})
    struct_keys = pa.table({"key": [{"k": 1}], "value": [1], "offset": [1], "time": [0]})
    prior = [pa.table({"key": ["a"], "value": ["old"]}), pa.table({"key": ["b"], "value": [7]})]
    p = TestPipeline()
    result = (p | "Cmds" >> beam.Create([good, strings, struct_keys])
              | UpsertBatches(prior=p | "Prior" >> beam.Create(prior), n_partitions=1)
              .with_invalid_output())
    assert_that(result.changes | beam.ParDo(batches_to_changes()),
                equal_to([("a", 1, 1), ("b", 7, -1), ("b", 2, 1), ("c", 3, 1)]),
                label="changes")

    def check(invalid):
        reasons = sorted(i.reason for i in invalid)
        if (len(reasons) != 3 or not reasons[0].startswith("column 'key' must hold keys")
                or "do not merge with string and int64" not in reasons[1]
                or not reasons[2].startswith("prior: key type string and value type string")):
            raise BeamAssertException(f"unexpected invalid output {reasons}")

    assert_that(result.invalid, check, label="invalid")
    p.run().wait_until_finish()


def test_columnar_nan_key_is_refused_like_the_row_api():
    """The row API refuses a NaN key (check_key); the columnar path keeps it and, as
    NaN != NaN, treats every NaN row as a new key: +a and +b, never a retraction."""
    from beam_upsert import upsert_table
    from beam_upsert.model import check_key

    assert check_key(float("nan")) is not None
    cmd = pa.table({"key": [float("nan"), float("nan"), 1.0], "value": ["a", "b", "c"],
                    "offset": [1, 2, 1], "time": [1, 2, 1]})
    result = upsert_table(cmd, with_invalid=True)
    assert result.changes.to_pylist() == [{"key": 1.0, "value": "c", "diff": 1, "time": 1}]
    assert len(result.invalid) == 2


def test_columnar_keys_minus_zero_and_zero_are_two_keys_as_in_the_row_api():
    """Beam groups keys by their encoded bytes: -0.0 and 0.0 are two keys there, and
    the columnar path (which documents the row API's rules) merges them into one."""
    from beam_upsert import upsert_table
    from beam_upsert.prepare import KEY_CODER

    assert KEY_CODER.encode(-0.0) != KEY_CODER.encode(0.0)
    cmd = pa.table({"key": [-0.0, 0.0], "value": ["a", "b"], "offset": [1, 2],
                    "time": [1, 2]})
    changes = upsert_table(cmd)
    assert [c["diff"] for c in changes.to_pylist()] == [1, 1]


def test_columnar_sub_microsecond_time_refuses_the_row_not_the_table():
    """``time`` may be "any timestamp type"; one ns-precision row makes the safe cast to
    µs raise ArrowInvalid for the whole table instead of going to ``invalid``."""
    from beam_upsert import upsert_table

    cmd = pa.table({"key": [1, 2], "value": ["a", "b"], "offset": [1, 1],
                    "time": pa.array([1000, 1001], pa.timestamp("ns"))})
    result = upsert_table(cmd, with_invalid=True)
    assert [c["key"] for c in result.changes.to_pylist()] == [1]
    assert len(result.invalid) == 1
