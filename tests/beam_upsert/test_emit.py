"""Emitted changes: in the global window at their times, whatever the input's
windowing, rewindowing downstream by those times (bounded and streaming), and
the steps counted by kind."""

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

from beam_upsert import Upsert, UpsertCommand
from tests.beam_upsert.helpers import run_upsert

FLAVORS = ("stateful", "grouped")

# key, value, offset, time (s); some keys span several upstream windows.
COMMANDS = [("k", "a", 1, 0), ("k", "b", 2, 1), ("j", "x", 3, 1), ("j", None, 4, 3),
            ("k", None, 5, 3), ("k", "c", 6, 7), ("m", "q", 1, 12), ("m", "r", 2, 12)]
# (window repr, micros, key, value, diff)
EXPECTED = [
    ("GlobalWindow", 0, "k", "a", 1),
    ("GlobalWindow", 1_000_000, "k", "a", -1), ("GlobalWindow", 1_000_000, "k", "b", 1),
    ("GlobalWindow", 1_000_000, "j", "x", 1),
    ("GlobalWindow", 3_000_000, "j", "x", -1), ("GlobalWindow", 3_000_000, "k", "b", -1),
    ("GlobalWindow", 7_000_000, "k", "c", 1),
    ("GlobalWindow", 12_000_000, "m", "r", 1),
]
# Downstream FixedWindows(5) + GroupByKey on the key: window start -> sorted changes.
EXPECTED_GROUPED = [
    (0, "j", [("x", -1), ("x", 1)]),
    (0, "k", [("a", -1), ("a", 1), ("b", -1), ("b", 1)]),
    (5_000_000, "k", [("c", 1)]),
    (10_000_000, "m", [("r", 1)]),
]


class _Where(beam.DoFn):
    def process(self, c, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam):
        yield repr(w), ts.micros, c.key, c.value, c.diff


class _Grouped(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam):
        yield w.start.micros, kv[0], sorted(kv[1])


def _check(changes):
    assert_that(changes | "Where" >> beam.ParDo(_Where()), equal_to(EXPECTED),
                label="InTheGlobalWindow")
    grouped = (changes
               | "Rewindow" >> beam.WindowInto(window.FixedWindows(5))
               | "ByKey" >> beam.Map(lambda c: (c.key, (c.value, c.diff)))
               | "Group" >> beam.GroupByKey()
               | "Starts" >> beam.ParDo(_Grouped()))
    assert_that(grouped, equal_to(EXPECTED_GROUPED), label="Rewindowed")


UPSTREAM = {
    "global": None,
    "fixed": window.FixedWindows(2),
    "sliding": window.SlidingWindows(4, 2),   # each command in two windows
    "sessions": window.Sessions(1),
}


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("upstream", sorted(UPSTREAM))
def test_bounded_changes_window_and_rewindow(flavor, upstream):
    with TestPipeline() as p:
        cmds = (p | beam.Create(COMMANDS)
                | beam.Map(lambda c: TimestampedValue(UpsertCommand(*c[:3]), c[3])))
        if UPSTREAM[upstream] is not None:
            cmds = cmds | beam.WindowInto(UPSTREAM[upstream])
        _check(cmds | Upsert(flavor))


def _streaming():
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    return TestPipeline(options=options)


@pytest.mark.parametrize("upstream", ["global", "fixed"])
def test_streaming_changes_window_and_rewindow(upstream):
    stream = TestStream()
    for t in sorted({c[3] for c in COMMANDS}):
        stream = stream.add_elements(
            [TimestampedValue(c[:3], c[3]) for c in COMMANDS if c[3] == t])
        stream = stream.advance_watermark_to(t + 1)
    stream = stream.advance_watermark_to_infinity()
    p = _streaming()
    cmds = p | stream
    if UPSTREAM[upstream] is not None:
        cmds = cmds | beam.WindowInto(UPSTREAM[upstream])
    _check(cmds | Upsert("stateful"))
    p.run().wait_until_finish()


def test_untimestamped_input_changes_are_at_the_minimum_timestamp():
    for flavor in FLAVORS:
        with TestPipeline() as p:
            changes = p | beam.Create([("k", "a", 1), ("k", "b", 2)]) | Upsert(flavor)
            assert_that(changes | beam.ParDo(_Where()), equal_to(
                [("GlobalWindow", MIN_TIMESTAMP.micros, "k", "b", 1)]))


def test_thousands_of_distinct_times_keep_their_times():
    n = 5_000
    with TestPipeline() as p:
        changes = (p | beam.Create(range(n))
                   | beam.Map(lambda i: TimestampedValue(("k", i, i), Timestamp(micros=i * 1000)))
                   | Upsert("grouped"))
        # +i at time i ms, its retraction -i at time i + 1 ms.
        assert_that(
            changes | beam.ParDo(_Where())
            | beam.Filter(lambda r: r[1] != (r[3] + (r[4] < 0)) * 1000 or r[0] != "GlobalWindow"),
            equal_to([]), label="EachAtItsTime")
        assert_that(changes | beam.combiners.Count.Globally(), equal_to([2 * n - 1]),
                    label="Count")


def test_streaming_late_command_rewindows_by_its_time():
    # "k" at 1 s, then the watermark passes 20 s, then a late update of "k" at
    # 2 s with a higher offset: its changes are stamped 2 s (the late time).
    stream = (TestStream()
              .add_elements([TimestampedValue(("k", "a", 1), 1)])
              .advance_watermark_to(20)
              .add_elements([TimestampedValue(("k", "b", 2), 2)])
              .advance_watermark_to_infinity())
    p = _streaming()
    changes = p | stream | Upsert("stateful")
    assert_that(changes | "Where" >> beam.ParDo(_Where()), equal_to([
        ("GlobalWindow", 1_000_000, "k", "a", 1),
        ("GlobalWindow", 2_000_000, "k", "a", -1), ("GlobalWindow", 2_000_000, "k", "b", 1)]),
        label="InTheGlobalWindow")
    p.run().wait_until_finish()


@pytest.mark.parametrize("flavor", ("stateful", "grouped"))
def test_inserts_updates_deletes_are_counted_per_step(flavor):
    commands = [("k", "a", 1, 0), ("k", "b", 2, 1), ("k", None, 3, 2), ("k", "c", 4, 3),
                ("j", None, 1, 0),                     # delete of nothing: no step
                ("m", "x", 1, 0), ("m", "x", 2, 1),    # idempotent: no step
                ("p", "old", 0, 0)]
    got = run_upsert(
        commands, prior=[("q", "seed")], flavor=flavor,
        expected=[("k", "a", 1, 0), ("k", "a", -1, 1), ("k", "b", 1, 1), ("k", "b", -1, 2),
                  ("k", "c", 1, 3), ("m", "x", 1, 0), ("p", "old", 1, 0)])
    assert (got.get("inserts", 0), got.get("updates", 0), got.get("deletes", 0)) == (4, 1, 1)


@pytest.mark.parametrize("flavor", ("stateful", "grouped"))
def test_prior_value_update_and_delete_are_counted(flavor):
    got = run_upsert([("q", "new", 1, 0), ("r", None, 1, 0)],
                     prior=[("q", "seed"), ("r", "seed")], flavor=flavor,
                     expected=[("q", "seed", -1, 0), ("q", "new", 1, 0), ("r", "seed", -1, 0)])
    assert (got.get("inserts", 0), got.get("updates", 0), got.get("deletes", 0)) == (0, 1, 1)
