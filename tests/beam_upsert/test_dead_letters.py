"""invalid_to_json: one deterministic, strictly parseable JSON line per dead letter."""

import datetime
import decimal
import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from beam_upsert import Invalid, Upsert, UpsertCommand, UpsertError, invalid_to_json


def _strict(text):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def _canonical(data):
    return json.dumps(data, sort_keys=True, allow_nan=False, separators=(", ", ": "))


# Plain JSON data: encoded as itself.
json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)

# Everything else a dead letter may hold.
scalars = (st.none() | st.booleans() | st.integers() | st.text() | st.binary()
           | st.floats()   # NaN and infinities too
           | st.datetimes() | st.dates()
           | st.decimals(allow_nan=False, allow_infinity=False)
           | st.integers(-2**63, 2**63 - 1).map(np.int64)
           | st.floats(width=32).map(np.float32) | st.booleans().map(np.bool_)
           | st.text().map(UpsertError))
elements = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(st.text() | st.integers(), inner, max_size=4)
                   | st.frozensets(st.integers() | st.text(), max_size=4)
                   | st.builds(UpsertCommand, inner, inner, inner)),
    max_leaves=12)


@given(element=elements, reason=st.text())
def test_every_dead_letter_encodes_to_strict_canonical_json(element, reason):
    text = invalid_to_json(Invalid(element, reason))
    data = _strict(text)
    assert set(data) == {"element", "reason"} and data["reason"] == reason
    # One encoding: decoding and encoding again gives the same text.
    assert _canonical(data) == text
    assert text.isascii()
    assert invalid_to_json((element, reason)) == text   # a plain pair, the same


@given(element=json_data, reason=st.text())
def test_plain_json_data_round_trips(element, reason):
    assert _strict(invalid_to_json(Invalid(element, reason))) == {
        "element": element, "reason": reason}


@given(entries=st.dictionaries(st.text() | st.integers(), st.integers() | st.text(),
                               max_size=6))
def test_a_dicts_order_does_not_change_its_encoding(entries):
    backwards = dict(reversed(list(entries.items())))
    assert invalid_to_json(Invalid(entries, "r")) == invalid_to_json(Invalid(backwards, "r"))


@pytest.mark.parametrize("element, encoded", [
    (UpsertError("bad json"), {"error": "bad json"}),
    (UpsertCommand(("a", 1), {"v": 1.5}, 7), {"key": ["a", 1], "value": {"v": 1.5}, "offset": 7}),
    (UpsertCommand("k", UpsertError("no"), 1), {"key": "k", "value": {"error": "no"}, "offset": 1}),
    (b"caf\xc3\xa9 \xff", "café \\xff"),
    (datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc),
     "2024-05-01T12:30:00+00:00"),
    (datetime.date(2024, 5, 1), "2024-05-01"),
    (Timestamp.of(1.5), "1970-01-01T00:00:01.500000Z"),
    (decimal.Decimal("1.10"), "1.10"),
    (np.int32(7), 7), (np.float64(0.25), 0.25), (np.bool_(False), False),
    (np.array([1.0, 2.0], np.float32), [1.0, 2.0]),
    ([float("nan"), float("inf"), -float("inf")], ["NaN", "Infinity", "-Infinity"]),
    ({1: "a", ("x", 2): "b"}, {"1": "a", '["x", 2]': "b"}),
    ({3, 1, 2}, [1, 2, 3]),
    (Invalid("inner", "nested"), {"element": "inner", "reason": "nested"}),
])
def test_each_kind_of_value_has_one_encoding(element, encoded):
    assert _strict(invalid_to_json(Invalid(element, "why"))) == {"element": encoded,
                                                                 "reason": "why"}


def test_a_value_and_an_error_are_both_objects_and_told_apart_by_shape():
    value = _strict(invalid_to_json(Invalid(UpsertCommand("k", {"a": 1}, 1), "r")))
    error = _strict(invalid_to_json(Invalid(UpsertCommand("k", UpsertError("x"), 1), "r")))
    assert value["element"]["value"] == {"a": 1} and error["element"]["value"] == {"error": "x"}


@pytest.mark.parametrize("bad", ["text", ("one",), ("a", "b", "c"), None])
def test_something_else_than_a_dead_letter_is_refused(bad):
    with pytest.raises(TypeError, match="expected Invalid"):
        invalid_to_json(bad)


def test_a_pipelines_invalid_output_encodes_line_by_line():
    commands = [TimestampedValue(UpsertCommand("k", {"v": 1}, 1), 10),
                TimestampedValue(UpsertCommand(None, {"v": 2}, 2), 10),
                TimestampedValue(UpsertCommand("k", b"\x00raw", float("nan")), 10)]
    p = TestPipeline()
    result = (p | beam.Create(commands) | Upsert("grouped").with_invalid_output())
    lines = result.invalid | beam.Map(invalid_to_json)
    assert_that(lines | beam.Map(lambda line: _strict(line)["element"]), equal_to([
        {"key": None, "value": {"v": 2}, "offset": 2},
        {"key": "k", "value": "\u0000raw", "offset": "NaN"}]))
    p.run().wait_until_finish()
