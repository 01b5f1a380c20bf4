"""Unusual command elements: the prepare stage's fast path must act exactly as
check_command does (valid ones keyed unchanged, the others to ``invalid``)."""

import collections
import decimal
import enum

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from beam_upsert import Upsert, UpsertCommand
from beam_upsert.model import check_command
from tests.beam_upsert.helpers import counters

FLAVORS = ("stateful", "grouped")


class Color(enum.IntEnum):
    RED = 7


class MyStr(str):
    pass


class MyTuple(tuple):
    pass


OtherCmd = collections.namedtuple("OtherCmd", "key value offset")
Reordered = collections.namedtuple("Reordered", "offset value key")

ELEMENTS = [
    ("plain", "v", 1),
    (b"bytes", "v", b"o"),
    ("stroff", "v", "o"),
    (2 ** 70, "v", 2 ** 70),          # a big int key and offset
    (-5, "v", -(2 ** 70)),
    UpsertCommand("uc", "v", 1),
    UpsertCommand("uc_none", None, 1),  # a delete of nothing
    (True, "v", 1),                   # bool key
    ("boolofs", "v", True),           # bool offset
    (1.5, "v", 1),                    # float key
    (float("nan"), "v", 1),           # NaN key
    ("nanofs", "v", float("nan")),    # NaN offset
    ("infofs", "v", float("inf")),
    ("decofs", "v", decimal.Decimal("NaN")),
    (np.int64(3), "v", 1),            # numpy key
    ("npofs", "v", np.int64(3)),      # numpy offset
    (Color.RED, "v", 1),              # IntEnum key
    ("enumofs", "v", Color.RED),      # IntEnum offset
    (("a", 1), "v", 1),               # tuple key
    (("a", None), "v", 1),            # tuple key with None
    ("tupofs", "v", (1, "a")),
    (None, "v", 1),
    ("noneofs", "v", None),
    ["list", "v", 1],
    {"key": "d", "value": "v", "offset": 1},
    ("two", "v"),
    ("four", "v", 1, 2),
    (),
    "abc",                            # a str of length 3
    b"xyz",
    OtherCmd("other", "v", 1),
    Reordered(1, "v", "reord"),
    MyTuple(("mytuple", "v", 1)),
    UpsertCommand(None, "v", 1),
    UpsertCommand("uc_badofs", "v", frozenset()),
    ("objofs", "v", object),
    ({"a": 1}, "v", 1),
]


def _oracle(elements):
    changes, invalid = [], []
    for i, element in enumerate(elements):
        command, reason = check_command(element)
        if command is None:
            invalid.append((repr(element), reason))
        elif command.value is not None:
            changes.append((repr(command.key), type(command.key).__name__,
                            repr(command.value), 1, i))
    return changes, invalid


class _Stamp(beam.DoFn):
    def process(self, indexed):
        i, element = indexed
        yield TimestampedValue(element, i)


class _Describe(beam.DoFn):
    def process(self, change, ts=beam.DoFn.TimestampParam):
        yield (repr(change.key), type(change.key).__name__, repr(change.value), change.diff,
               ts.micros // 1_000_000)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_unusual_elements_are_checked_as_by_check_command(flavor):
    expected_changes, expected_invalid = _oracle(ELEMENTS)
    p = TestPipeline()
    result = (p | beam.Create(list(enumerate(ELEMENTS)), reshuffle=False)
              | beam.ParDo(_Stamp())
              | Upsert(flavor).with_invalid_output())
    assert_that(result.changes | beam.ParDo(_Describe()), equal_to(expected_changes),
                label="changes")
    assert_that(result.invalid | beam.Map(lambda i: (repr(i.element), i.reason)),
                equal_to(expected_invalid), label="invalid")
    res = p.run()
    res.wait_until_finish()
    got = counters(res)
    assert got.get("invalid", 0) == len(expected_invalid)
    assert got.get("inserts", 0) == len(expected_changes)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_resume_at_drops_fast_path_and_full_check_commands_alike(flavor):
    # Times 0..5; resume at 3 s drops times 0, 1, 2 whichever path they take.
    elements = [("a", "v", 1), (True, "v", 1), ("c", "v", 1.0),
                ("d", "v", 1), (Color.RED, "v", 1), ("f", "v", np.int64(1))]
    p = TestPipeline()
    result = (p | beam.Create(list(enumerate(elements)), reshuffle=False)
              | beam.ParDo(_Stamp())
              | Upsert(flavor, resume_at=3_000_000).with_invalid_output())
    assert_that(result.changes | beam.ParDo(_Describe()), equal_to([
        ("'d'", "str", "'v'", 1, 3), ("<Color.RED: 7>", "Color", "'v'", 1, 4)]),
        label="changes")
    # An invalid element goes to invalid even before resume_at (as before).
    assert_that(result.invalid | beam.Map(lambda i: repr(i.element)),
                equal_to([repr(("f", "v", np.int64(1)))]), label="invalid")
    res = p.run()
    res.wait_until_finish()
    got = counters(res)
    assert got.get("dropped_before_resume", 0) == 3
    assert got.get("invalid", 0) == 1


STREAM_SKIP = ()


def test_unusual_elements_on_streaming_input():
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream

    elements = [e if i not in STREAM_SKIP else ("skip%d" % i, None, 1)
                for i, e in enumerate(ELEMENTS)]
    expected_changes, expected_invalid = _oracle(elements)
    stream = TestStream()
    for i, e in enumerate(elements):
        stream = stream.add_elements([TimestampedValue(e, i)]).advance_watermark_to(i + 1)
    stream = stream.advance_watermark_to_infinity()
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    p = TestPipeline(options=options)
    result = p | stream | Upsert("stateful").with_invalid_output()
    assert_that(result.changes | beam.ParDo(_Describe()), equal_to(expected_changes),
                label="changes")
    assert_that(result.invalid | beam.Map(lambda i: (repr(i.element), i.reason)),
                equal_to(expected_invalid), label="invalid")
    p.run().wait_until_finish()


class MyInt(int):
    pass


class Stateful(str):
    """Beam's coder would pickle its (empty) state: every one the same bytes."""

    def __setstate__(self, state):
        pass


class Overriding(bytes):
    def __bytes__(self):
        return b"other"


class Pair(collections.namedtuple("Pair", "name n")):
    pass


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_key_of_a_str_subclass_is_the_plain_key_it_equals(flavor):
    # Python finds MyStr("k") == "k" (and hashes them alike), so the upsert
    # does too: one key, whose later command wins, reported as a plain value.
    elements = [(MyStr("k"), "a", 1), ("k", "b", 2), ((MyStr("t"), MyInt(2)), "c", 1),
                (("t", 2), "d", 2), (MyInt(5), "e", 1),
                (Stateful("alice"), "f", 1), (Stateful("bob"), "g", 1),
                (Overriding(b"o"), "h", 1), (b"o", "i", 2),
                (Pair(MyStr("p"), 1), "j", 1), (Pair("p", 1), "k", 2),
                ((Color.RED, MyStr("x")), "l", 1), ((Color.RED, "x"), "m", 2),
                (MyTuple((MyStr("u"), 1)), "n", 1), (("u", 1), "o", 2)]
    p = TestPipeline()
    result = (p | beam.Create(list(enumerate(elements)), reshuffle=False)
              | beam.ParDo(_Stamp())
              | Upsert(flavor).with_invalid_output())
    assert_that(result.changes | beam.ParDo(_Describe()), equal_to([
        ("'k'", "str", "'a'", 1, 0), ("'k'", "str", "'a'", -1, 1), ("'k'", "str", "'b'", 1, 1),
        ("('t', 2)", "tuple", "'c'", 1, 2), ("('t', 2)", "tuple", "'c'", -1, 3),
        ("('t', 2)", "tuple", "'d'", 1, 3), ("5", "int", "'e'", 1, 4),
        ("'alice'", "str", "'f'", 1, 5), ("'bob'", "str", "'g'", 1, 6),
        ("b'o'", "bytes", "'h'", 1, 7), ("b'o'", "bytes", "'h'", -1, 8),
        ("b'o'", "bytes", "'i'", 1, 8),
        ("Pair(name='p', n=1)", "Pair", "'j'", 1, 9),
        ("Pair(name='p', n=1)", "Pair", "'j'", -1, 10),
        ("Pair(name='p', n=1)", "Pair", "'k'", 1, 10),
        ("(<Color.RED: 7>, 'x')", "tuple", "'l'", 1, 11),
        ("(<Color.RED: 7>, 'x')", "tuple", "'l'", -1, 12),
        ("(<Color.RED: 7>, 'x')", "tuple", "'m'", 1, 12),
        ("('u', 1)", "tuple", "'n'", 1, 13), ("('u', 1)", "tuple", "'n'", -1, 14),
        ("('u', 1)", "tuple", "'o'", 1, 14)]), label="changes")
    assert_that(result.invalid, equal_to([]), label="invalid")
    p.run().wait_until_finish()


def test_a_snapshot_key_of_a_str_subclass_meets_its_commands():
    p = TestPipeline()
    prior = p | "prior" >> beam.Create([(MyStr("k"), "old"), (Pair(MyStr("p"), 1), "was")])
    commands = (p | "commands" >> beam.Create(
        [(0, ("k", "new", 1)), (0, (Pair("p", 1), "now", 1))], reshuffle=False)
                | beam.ParDo(_Stamp()))
    result = commands | Upsert("grouped", prior=prior).with_invalid_output()
    assert_that(result.changes | beam.ParDo(_Describe()), equal_to([
        ("'k'", "str", "'old'", -1, 0), ("'k'", "str", "'new'", 1, 0),
        ("Pair(name='p', n=1)", "Pair", "'was'", -1, 0),
        ("Pair(name='p', n=1)", "Pair", "'now'", 1, 0)]), label="changes")
    assert_that(result.invalid, equal_to([]), label="invalid")
    p.run().wait_until_finish()
