"""beam_supertable.testing: throwaway tables, table and changelog matchers, upsert streams."""

import os
import re

import apache_beam as beam
import fsspec
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import ElementEvent, ProcessingTimeEvent, WatermarkEvent
from apache_beam.testing.util import assert_that
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable import NotATableError, Supertable, UpsertToSupertable, WriteToSupertable
from beam_supertable.testing import (
    assert_table_rows, changelog_equals, table_rows_equal, temporary_table, upsert_stream)
from beam_supertable.testing.diff import RowDiff, changelog_diff
from beam_upsert import Change, Upsert

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(ROOT, "docs", "guides", "testing.md")
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()),
                    ("emb", pa.list_(pa.float32(), 2))])
ROWS = [{"id": i, "name": f"n{i}", "emb": [i / 10, 0.3]} for i in range(4)]


def _streaming():
    return TestPipeline(options=PipelineOptions(streaming=True))


def _write_and_check(uri, rows, matcher):
    """Writes ``rows`` in one pipeline and applies ``matcher`` to its commits."""
    with TestPipeline() as p:
        commits = p | beam.Create(rows) | WriteToSupertable(uri)
        assert_that(commits, matcher)


# -- temporary_table -----------------------------------------------------------------
def test_a_memory_table_is_created_and_gone_after_the_block():
    with temporary_table(SCHEMA, primary_key="id") as uri:
        assert uri.startswith("memory://")
        t = Supertable.open(uri)
        assert t.version == 0 and t.primary_key == ["id"] and t.count_rows() == 0
    assert not fsspec.filesystem("memory").exists(uri)
    with pytest.raises(NotATableError):
        Supertable.open(uri)


def test_a_local_table_is_gone_with_its_directory(tmp_path):
    with temporary_table(SCHEMA, where="local", dir=tmp_path) as uri:
        folder = os.path.dirname(uri)
        assert os.path.dirname(folder) == str(tmp_path)
        _write_and_check(uri, ROWS, table_rows_equal(uri, ROWS))
        assert os.listdir(uri)
    assert not os.path.exists(folder)
    assert os.listdir(tmp_path) == []


def test_the_location_is_removed_when_the_test_fails():
    with pytest.raises(RuntimeError, match="boom"):
        with temporary_table(SCHEMA) as uri:
            raise RuntimeError("boom")
    assert not fsspec.filesystem("memory").exists(uri)
    with pytest.raises(RuntimeError, match="boom"):
        with temporary_table(SCHEMA, where="local") as local:
            raise RuntimeError("boom")
    assert not os.path.exists(os.path.dirname(local))


def test_without_a_schema_nothing_is_there_and_each_location_is_new():
    with temporary_table() as a, temporary_table() as b:
        assert a != b
        with pytest.raises(NotATableError):
            Supertable.open(a)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="where must be one of"):
        with temporary_table(where="s3"):
            pass
    with pytest.raises(ValueError, match="need a schema"):
        with temporary_table(primary_key="id"):
            pass
    with pytest.raises(ValueError, match="dir is for where='local'"):
        with temporary_table(dir="/tmp"):
            pass


# -- table_rows_equal through pipelines -------------------------------------------------
def test_the_matcher_passes_on_the_rows_in_any_order_with_float32_vectors():
    with temporary_table(SCHEMA) as uri:
        expected = [dict(r, emb=np.array(r["emb"])) for r in reversed(ROWS)]
        _write_and_check(uri, ROWS, table_rows_equal(uri, expected))
        assert_table_rows(uri, ROWS, key="id")
        assert_table_rows(uri, [{"id": r["id"]} for r in ROWS])     # one column only


EXTRA = {"id": 9, "name": "x", "emb": [0.0, 0.0]}
# (rows written, rows expected, what the failure says)
WRONG = {
    "missing": (ROWS[:3], ROWS, r"missing \(expected, not in the table\): 1\n.*'id': 3"),
    "extra": (ROWS + [EXTRA], ROWS, r"unexpected \(in the table, not expected\): 1\n.*'id': 9"),
    "changed": (ROWS, [dict(ROWS[0], name="other")] + ROWS[1:],
                r"missing.*'name': 'other'.*unexpected.*'name': 'n0'"),
    "vector": (ROWS, [dict(ROWS[0], emb=[0.0, 0.31])] + ROWS[1:], r"missing.*0\.31"),
}


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_the_matcher_fails_the_pipeline_on_wrong_rows(kind):
    written, expected, message = WRONG[kind]
    with temporary_table(SCHEMA) as uri:
        with pytest.raises(Exception, match=re.compile("table_rows_equal: .*" + message, re.S)):
            _write_and_check(uri, written, table_rows_equal(uri, expected))


def test_by_key_a_changed_row_is_named_column_by_column():
    with temporary_table(SCHEMA) as uri:
        expected = [dict(ROWS[2], name="B")] + [r for r in ROWS if r["id"] != 2]
        with pytest.raises(Exception, match=re.compile(
                r"changed rows: 1\n\s+id=2: name: expected 'B', got 'n2'")):
            _write_and_check(uri, ROWS, table_rows_equal(uri, expected, key="id"))


def test_the_matcher_reads_the_version_it_is_given():
    with temporary_table(SCHEMA) as uri:
        _write_and_check(uri, ROWS[:2], table_rows_equal(uri, ROWS[:2]))
        _write_and_check(uri, ROWS[2:], table_rows_equal(uri, ROWS, version=2))
        assert_table_rows(uri, ROWS[:2], version=1)
        # The rows of version 1 are not those of version 2, the latest (a write
        # of no rows commits nothing).
        with pytest.raises(Exception, match="at version 2 .version 2. differs"):
            _write_and_check(uri, [], table_rows_equal(uri, ROWS[:2], version=2))
        with pytest.raises(AssertionError, match="version 2 .latest version. differs"):
            assert_table_rows(uri, ROWS[:2])
        with pytest.raises(AssertionError, match="cannot open .* at the version 7"):
            assert_table_rows(uri, ROWS, version=7)


def test_assert_table_rows_names_what_cannot_be_compared():
    with temporary_table(SCHEMA) as uri:
        with pytest.raises(AssertionError, match=r"has no column\(s\) \['colour'\]"):
            assert_table_rows(uri, [{"id": 1, "colour": "red"}])
        with pytest.raises(ValueError, match=r"expected row 1 lacks column\(s\) \['name'\]"):
            assert_table_rows(uri, [{"id": 1, "name": "a"}, {"id": 2}])
        with pytest.raises(ValueError, match=r"key column\(s\) \['id'\] are not among"):
            table_rows_equal(uri, [{"name": "a"}], key="id")
        with pytest.raises(ValueError, match="expected row 0 must be a dict"):
            table_rows_equal(uri, [(1, "a")])
    with pytest.raises(AssertionError, match="cannot open"):
        assert_table_rows(uri, [])


def test_ordered_compares_position_by_position():
    with temporary_table(SCHEMA) as uri:
        Supertable.open(uri).append(ROWS)
        assert_table_rows(uri, ROWS, ordered=True)
        with pytest.raises(AssertionError, match=r"row 0: id: expected 1, got 0"):
            assert_table_rows(uri, [ROWS[1], ROWS[0]] + ROWS[2:], ordered=True)


# -- the row comparison, many cases ---------------------------------------------------------
_row = st.fixed_dictionaries({
    "id": st.integers(0, 5), "name": st.sampled_from(["a", "b", None]),
    "x": st.one_of(st.floats(-1e6, 1e6, width=32), st.just(float("nan"))),
})


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_row, max_size=12), data=st.data())
def test_any_order_of_the_same_rows_matches_and_a_changed_one_does_not(rows, data):
    diff = RowDiff(["id", "name", "x"], ["x"], [], False, 1e-6, 1e-9)
    shuffled = data.draw(st.permutations(rows))
    assert diff(shuffled, rows) is None
    if rows:
        i = data.draw(st.integers(0, len(rows) - 1))
        changed = list(shuffled)
        changed[i] = dict(changed[i], id=changed[i]["id"] + 10)
        found = diff(changed, rows)
        assert "missing" in found and "unexpected" in found


# -- changelog_equals ----------------------------------------------------------------
_change = st.tuples(st.sampled_from(["k", "j", 1]), st.sampled_from(["a", "b", None, 2]))


@settings(max_examples=200, deadline=None)
@given(net=st.lists(_change, max_size=8), undone=st.lists(_change, max_size=8),
       data=st.data())
def test_retractions_that_cancel_do_not_change_the_net_changelog(net, undone, data):
    expected = [Change(k, v, +1) for k, v in net]
    noisy = expected + [Change(k, v, d) for k, v in undone for d in (+1, -1)]
    assert changelog_diff(expected, data.draw(st.permutations(noisy))) is None
    if undone:
        assert changelog_diff(expected, noisy, consolidate=False) is not None


def test_the_changelog_diff_is_per_key_and_net():
    found = changelog_diff([Change("k", "b", 1), ("j", {"x": 1}, 1)],
                           [Change("k", "a", 1), Change("k", "b", 1), Change("k", "b", -1),
                            Change("j", {"x": 1}, 1)])
    assert found == (
        "the changelog differs at 1 key(s) (net diff per value; a +1 and a -1 of one value "
        "cancel):\n  key 'k':\n    value 'b': expected net +1, got +0 (missing)\n"
        "    value 'a': expected net +0, got +1 (unexpected)")
    with pytest.raises(ValueError, match=r"expected element 0: the diff of \('k', 'a', 'x'\)"):
        changelog_equals([("k", "a", "x")])
    with pytest.raises(ValueError, match="expected element 1: expected Change"):
        changelog_equals([Change("k", "a", 1), "k"])


def test_changelog_equals_checks_upserts_driven_by_the_stream_builder():
    # a@1 and c@3 arrive first; b@2 arrives before the watermark passes 2:
    # the changelog walks a -> b -> c, whose net is +c.
    stream = (upsert_stream()
              .command("k", "a", 1, at=1).command("k", "c", 3, at=3)
              .advance_watermark(to=2)
              .command("k", "b", 2, at=2).delete("j", 1, at=2)
              .advance_processing_time(1)
              .advance_watermark(to=5)
              .build())
    steps = [("k", "a", 1, 1), ("k", "a", -1, 2), ("k", "b", 1, 2), ("k", "b", -1, 3),
             ("k", "c", 1, 3)]
    p = _streaming()
    changes = p | stream | Upsert("stateful")
    timed = changes | beam.Map(lambda c, ts=beam.DoFn.TimestampParam: (
        c.key, c.value, c.diff, ts.micros // 1_000_000))
    assert_that(changes, changelog_equals([Change("k", "c", +1)]), label="net")
    assert_that(timed, changelog_equals(steps, consolidate=False), label="exact")
    p.run().wait_until_finish()


def test_changelog_equals_fails_the_pipeline_with_the_difference_per_key():
    stream = (upsert_stream().command("k", "a", 1, at=1).advance_watermark(to=2)
              .command("k", "b", 2, at=3).build())
    p = _streaming()
    assert_that(p | stream | Upsert("stateful"), changelog_equals([Change("k", "a", +1)]))
    with pytest.raises(Exception, match=re.compile(
            r"changelog_equals: .*key 'k':\n\s+value 'a': expected net \+1, got \+0 \(missing\)"
            r"\n\s+value 'b': expected net \+0, got \+1 \(unexpected\)", re.S)):
        p.run().wait_until_finish()


# -- upsert_stream -------------------------------------------------------------------
def test_the_stream_drives_upsert_to_supertable_with_watermark_steps():
    def row(i, name):
        return {"id": i, "name": name, "emb": [float(i), 0.5]}

    stream = (upsert_stream()
              .commands([(1, row(1, "a"), 1, 10), (2, row(2, "b"), 1, 10)])
              .advance_watermark(to=11)
              .command(1, row(1, "a2"), 2, at=12)
              .delete(2, 2, at=12)
              .command(3, row(3, "c"), 1, at=12)
              .advance_watermark(to=13)
              .command(3, row(3, "stale"), 0, at=11)     # late, older offset: dropped
              .advance_watermark(to=14)
              .build())
    with temporary_table() as uri:
        p = _streaming()
        commits = p | stream | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id",
                                                  flavor="stateful")
        assert_that(commits, table_rows_equal(uri, [row(1, "a2"), row(3, "c")], key="id"))
        p.run().wait_until_finish()
        t = Supertable.open(uri)
        assert t.version >= 2                     # a commit per slot the watermark passed
        first = [v for v in range(t.version + 1) if t.checkout(v).count_rows() == 2][0]
        assert_table_rows(uri, [row(1, "a"), row(2, "b")], version=first, key="id")


def test_the_builder_batches_commands_settles_and_ends_at_infinity_unless_told():
    builder = (upsert_stream().command("k", 1, 1, at=1).delete("j", 1, at=Timestamp(2))
               .advance_watermark(to=1.5).advance_processing_time(0.25)
               .command("k", 2, 2, at=3.5))
    events = builder.build()._events
    assert [type(e) for e in events] == [ElementEvent, WatermarkEvent, ProcessingTimeEvent,
                                         ElementEvent, WatermarkEvent, WatermarkEvent]
    assert [(tv.value, tv.timestamp) for tv in events[0].timestamped_values] == [
        (("k", 1, 1), Timestamp(1)), (("j", None, 1), Timestamp(2))]
    # Past the commit slot of the latest command (3.5 s), then to infinity.
    assert [e.new_watermark for e in events[-2:]] == [Timestamp(4.001), MAX_TIMESTAMP]
    assert builder.build(settle=False)._events[-2:] == [events[3], events[-1]]
    assert type(builder.build(to_infinity=False)._events[-1]) is ElementEvent
    assert len(builder.build()._events) == 6      # building twice adds nothing


def test_what_only_the_last_command_sets_off_reaches_assert_that():
    # The last command's time is above every watermark step: the settling
    # step fires it before the jump to infinity, so the matcher sees "b".
    stream = (upsert_stream().command("k", "a", 1, at=1).advance_watermark(to=2)
              .command("k", "b", 2, at=3).build())
    p = _streaming()
    assert_that(p | stream | Upsert("stateful"), changelog_equals([Change("k", "b", +1)]))
    p.run().wait_until_finish()


def test_the_builder_refuses_steps_a_runner_cannot_take():
    with pytest.raises(ValueError, match=r"advance_watermark\(to=2\) must move past"):
        upsert_stream().advance_watermark(to=3).advance_watermark(to=2)
    with pytest.raises(ValueError, match="not a whole millisecond"):
        upsert_stream().advance_watermark(to=1.0001)
    with pytest.raises(ValueError, match="positive whole number of milliseconds"):
        upsert_stream().advance_processing_time(0)
    with pytest.raises(TypeError, match="at must be seconds"):
        upsert_stream().command("k", 1, 1, at="soon")
    with pytest.raises(ValueError, match="commands item 0 must be a tuple"):
        upsert_stream().commands([("k", 1, 1)])


# -- the guide's example ---------------------------------------------------------------
def _guide_tests():
    """The fenced python block of docs/guides/testing.md titled test_*.py."""
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r'^```python title="test_\w+\.py"\n(.*?)^```', text, re.S | re.M)
    assert len(blocks) == 1, "the testing guide has one example test file"
    return blocks[0]


def test_the_testing_guides_example_runs():
    namespace = {"__name__": "test_my_pipeline"}
    exec(compile(_guide_tests(), GUIDE, "exec"), namespace)  # noqa: S102 - our own docs
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert len(tests) == 2
    for test in tests:
        test()
