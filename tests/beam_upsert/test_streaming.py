"""The stateful flavor on unbounded input (TestStream): watermark-driven."""

from typing import Any, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from beam_upsert import Upsert
from beam_upsert.prepare import CMD, INVALID_TAG, PrepareCommands, PreparePrior, encode_key
from beam_upsert.stateful import COUNTS_TAG, ShardKeys, StatefulUpsertFn
from tests.beam_upsert.helpers import _WithTime, counters


def _stream(events):
    """events: ("add", [(key, value, offset, time)]) or ("wm", t)."""
    ts = TestStream()
    for kind, arg in events:
        if kind == "add":
            ts = ts.add_elements([TimestampedValue((k, v, o), t) for k, v, o, t in arg])
        else:
            ts = ts.advance_watermark_to(arg)
    return ts.advance_watermark_to_infinity()


def _streaming_pipeline():
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    return TestPipeline(options=options)


def _run(events, expected, prior=None, flavor="auto", expected_invalid=None):
    p = _streaming_pipeline()
    commands = p | _stream(events)
    prior_pc = p | beam.Create(prior) if prior is not None else None
    result = commands | Upsert(flavor, prior=prior_pc).with_invalid_output()
    assert_that(result.changes | beam.ParDo(_WithTime()), equal_to(expected))
    if expected_invalid is not None:
        assert_that(result.invalid | beam.Map(lambda i: tuple(i.element)),
                    equal_to(expected_invalid), label="invalid")
    result = p.run()
    result.wait_until_finish()
    return counters(result)


def test_auto_picks_stateful_for_unbounded_input():
    p = TestPipeline(options=PipelineOptions(streaming=True))
    commands = p | _stream([("add", [("k", 1, 1, 0)])])
    assert Upsert().resolved_flavor(commands) == "stateful"


def test_consolidation_waits_for_the_watermark():
    # The lower offset arrives first; applying it on arrival would emit
    # +a, -a, +b instead of the single consolidated +b.
    _run([("add", [("k", "a", 1, 5)]), ("wm", 4), ("add", [("k", "b", 2, 5)]), ("wm", 10)],
         expected=[("k", "b", 1, 5)])


def test_arrival_order_inside_a_time_does_not_matter():
    rows = [("k", "x", 3, 5), ("k", "y", 1, 5), ("k", "z", 2, 5), ("j", "q", 1, 5)]
    for order in (rows, rows[::-1], [rows[2], rows[0], rows[3], rows[1]]):
        events = [("add", [r]) for r in order] + [("wm", 6)]
        _run(events, expected=[("k", "x", 1, 5), ("j", "q", 1, 5)])


def test_times_apply_as_the_watermark_passes_each():
    _run([("add", [("k", "a", 1, 1), ("k", "c", 3, 3)]), ("wm", 2),
          ("add", [("k", "b", 2, 2)]), ("wm", 5)],
         expected=[("k", "a", 1, 1), ("k", "a", -1, 2), ("k", "b", 1, 2),
                   ("k", "b", -1, 3), ("k", "c", 1, 3)])


def test_late_commands_follow_rule_5():
    _run([
        ("add", [("k", "a", 10, 5)]), ("wm", 10),
        # Late, newer offset: applied at the key's applied time (5).
        ("add", [("k", "b", 11, 4)]), ("wm", 11),
        # Late, older offset than one already applied: dropped, counted.
        ("add", [("k", "c", 9, 5)]), ("wm", 12),
    ], expected=[("k", "a", 1, 5), ("k", "a", -1, 5), ("k", "b", 1, 5)])
    # The streaming DirectRunner drops counters bumped after the final
    # watermark advance, so the late/stale counts are checked on the rule
    # itself (tests/beam_upsert/test_model.py).


def test_streaming_rehydrates_from_prior():
    got = _run([("add", [("k", "b", 1, 5), ("n", "x", 2, 5)]), ("wm", 6)],
               prior=[("k", "a")],
               expected=[("k", "a", -1, 5), ("k", "b", 1, 5), ("n", "x", 1, 5)])
    assert got.get("rehydrated") == 1


def test_incomparable_offsets_do_not_stall_the_key():
    # Before: the per-key rule raised on 5 vs "6" at every firing of the key.
    _run([
        ("add", [("k", "a", 5, 1), ("k", "b", "6", 1)]), ("wm", 2),
        ("add", [("k", "c", 7, 3)]), ("wm", 4),
        # Late and of another class than the live value's offsets.
        ("add", [("k", "x", "9", 2)]), ("wm", 5),
        ("add", [("k", "d", 8, 6)]), ("wm", 7),
    ], expected=[("k", "a", 1, 1), ("k", "a", -1, 3), ("k", "c", 1, 3),
                 ("k", "c", -1, 6), ("k", "d", 1, 6)],
        expected_invalid=[("k", "b", "6"), ("k", "x", "9")])


def test_a_late_command_older_than_a_delete_is_dropped():
    # The deleted key keeps a tombstone: a late command whose offset (9) is
    # older than the delete's (11) is stale, not applied at its own time.
    _run([
        ("add", [("k", "a", 10, 5)]), ("wm", 6),
        ("add", [("k", None, 11, 6)]), ("wm", 7),
        ("add", [("k", "b", 9, 4)]), ("wm", 8),
    ], expected=[("k", "a", 1, 5), ("k", "a", -1, 6)])


def _state_sizes(events, prior, expected):
    """Runs the stateful flavor's DoFn and asserts what each firing read and kept.

    Every key goes to one state shard, and each firing reports (entries the
    shard's stash held, entries written back), so the stash is measured by
    reading it, in a real pipeline.
    """
    p = _streaming_pipeline()
    commands = (p | _stream(events)
                | beam.ParDo(PrepareCommands(None)).with_outputs(INVALID_TAG, main="ok"))
    snapshot = (p | beam.Create(prior)
                | "PreparePrior" >> beam.ParDo(PreparePrior()).with_outputs(
                    INVALID_TAG, main="ok"))
    merged = ((commands.ok, snapshot.ok) | beam.Flatten()
              .with_output_types(Tuple[bytes, Any]))
    applied = (merged | beam.ParDo(ShardKeys(1)).with_output_types(Tuple[int, Any])
               | beam.ParDo(StatefulUpsertFn(tombstone_retention_micros=0)).with_outputs(
                   INVALID_TAG, COUNTS_TAG, main="changes"))
    assert_that(applied[COUNTS_TAG] | beam.Map(lambda counts: tuple(counts[5:7])),
                equal_to(expected))
    p.run().wait_until_finish()


def test_state_holds_the_live_value_and_pending_commands_only():
    events = [
        ("add", [("k", "a", 1, 10)]), ("wm", 11),      # read prior + cmd; keep a
        ("add", [("k", "b", 2, 20)]), ("wm", 21),      # read a + cmd; keep b
        ("add", [("k", None, 3, 30), ("k", "c", 4, 40)]), ("wm", 31),  # keep pending c only
        ("wm", 41),                                    # read c alone: no tombstone
        ("add", [("k", None, 5, 50)]), ("wm", 51),     # deleted: keep nothing
        ("add", [("j", None, 1, 60)]), ("wm", 61),     # deleting nothing keeps nothing
    ]
    expected = [(2, 1), (2, 1), (3, 1), (1, 1), (2, 0), (1, 0)]
    # Ten insert/delete cycles on one key: the state must not grow.
    for i in range(10):
        t = 100 + 10 * i
        events += [("add", [("m", i, 2 * i, t)]), ("wm", t + 1),
                   ("add", [("m", None, 2 * i + 1, t + 5)]), ("wm", t + 6)]
        expected += [(1, 1), (2, 0)]
    _state_sizes(events, [("k", "p")], expected)


def test_timers_and_state_are_per_shard_not_per_key():
    # A runner's fixed cost is per stateful key (on Flink's batch runner a
    # bundle per key): 2,000 keys at one time must fire 8 shard timers, not
    # 2,000 key timers, and still apply every key.
    p = TestPipeline()
    entries = [(encode_key(f"k{i}"), (CMD, 0, i, i)) for i in range(2000)]
    applied = (p | beam.Create(entries).with_output_types(Tuple[bytes, Any])
               | beam.ParDo(ShardKeys(8)).with_output_types(Tuple[int, Any])
               | beam.ParDo(StatefulUpsertFn()).with_outputs(
                   INVALID_TAG, COUNTS_TAG, main="changes"))
    assert_that(applied[COUNTS_TAG] | beam.Map(lambda counts: counts[0])
                | "Firings" >> beam.combiners.ToList()
                | beam.Map(lambda inserts: (len(inserts), sum(inserts))),
                equal_to([(8, 2000)]), label="firings")
    assert_that(applied.changes | beam.Map(lambda c: (c.key, c.value, c.diff)),
                equal_to([(f"k{i}", i, 1) for i in range(2000)]), label="changes")
    p.run().wait_until_finish()
