"""The model operator's scenarios, each on both flavors (bounded input)."""

from decimal import Decimal

import pytest
from apache_beam.testing.util import BeamAssertException
from apache_beam.utils.timestamp import Timestamp

from beam_upsert import Change, Upsert, UpsertCommand, UpsertError
from tests.beam_upsert.helpers import FLAVORS, run_upsert
from tests.beam_upsert.reference import reference, reference_upsert

pytestmark = pytest.mark.parametrize("flavor", FLAVORS)


def test_first_value_is_an_insert(flavor):
    got = run_upsert([("k", "a", 1, 0)], flavor=flavor, expected=[("k", "a", 1, 0)])
    assert got["inserts"] == 1


def test_update_retracts_the_old_value(flavor):
    run_upsert([("k", "a", 1, 0), ("k", "b", 2, 1)], flavor=flavor,
               expected=[("k", "a", 1, 0), ("k", "a", -1, 1), ("k", "b", 1, 1)])


def test_delete_existing(flavor):
    got = run_upsert([("k", "a", 1, 0), ("k", None, 2, 1)], flavor=flavor,
                     expected=[("k", "a", 1, 0), ("k", "a", -1, 1)])
    assert got["deletes"] == 1


def test_delete_nonexistent_emits_nothing(flavor):
    run_upsert([("k", None, 1, 0)], flavor=flavor, expected=[])


def test_reinsert_after_delete_is_an_insert(flavor):
    run_upsert([("k", "a", 1, 0), ("k", None, 2, 1), ("k", "a", 3, 2)], flavor=flavor,
               expected=[("k", "a", 1, 0), ("k", "a", -1, 1), ("k", "a", 1, 2)])


def test_idempotent_update_emits_nothing(flavor):
    run_upsert([("k", "a", 1, 0), ("k", "a", 2, 1)], flavor=flavor,
               expected=[("k", "a", 1, 0)])


def test_same_time_collapses_to_greatest_offset_whatever_the_order(flavor):
    run_upsert([("k", "c", 3, 0), ("k", "a", 1, 0), ("k", "z", 2, 0)], flavor=flavor,
               expected=[("k", "c", 1, 0)])


def test_rehydration_then_update(flavor):
    got = run_upsert([("k", "b", 5, 10)], prior=[("k", "a"), ("other", "x")], flavor=flavor,
                     expected=[("k", "a", -1, 10), ("k", "b", 1, 10)])
    assert got["rehydrated"] == 2
    assert got["updates"] == 1


def test_1500_keys_updated_in_one_step_on_a_snapshot(flavor):
    prior = [(f"k{i}", i) for i in range(1500)]
    commands = [(f"k{i}", i + 1, 100 + i, 7) for i in range(1500)]
    expected = [(f"k{i}", i, -1, 7) for i in range(1500)] + [
        (f"k{i}", i + 1, 1, 7) for i in range(1500)]
    got = run_upsert(commands, prior=prior, flavor=flavor, expected=expected)
    assert got["updates"] == 1500


def test_out_of_order_keys_across_times(flavor):
    commands = [("b", 2, 4, 3), ("a", 1, 1, 2), ("b", 1, 2, 1), ("a", 2, 3, 0), ("c", 9, 5, 2)]
    run_upsert(commands, flavor=flavor,
               expected=[(k, v, d, t) for k, v, d, t in reference_upsert(commands)])


def test_commands_below_resume_at_are_dropped(flavor):
    commands = [("k", "old", 1, 3), ("k", "new", 2, 5), ("j", "x", 3, 4)]
    got = run_upsert(commands, prior=[("k", "persisted")], flavor=flavor,
                     resume_at=Timestamp(5),
                     expected=[("k", "persisted", -1, 5), ("k", "new", 1, 5)])
    assert got["dropped_before_resume"] == 2


def test_errors_are_values_that_can_be_retracted(flavor):
    err = UpsertError("bad utf-8", b"\xff")
    run_upsert([("k", err, 1, 0), ("k", "fixed", 2, 1)], flavor=flavor,
               expected=[("k", err, 1, 0), ("k", err, -1, 1), ("k", "fixed", 1, 1)])


def test_named_tuple_commands_and_change_equality(flavor):
    run_upsert([(UpsertCommand("k", 1, 1)[0], 1, 1, 0)], flavor=flavor, expected=[("k", 1, 1, 0)])
    assert Change("k", 1, 1) == ("k", 1, 1)


def test_invalid_elements_go_to_the_invalid_output(flavor):
    # Upsert sees whatever Create gives; the helper wraps 3-tuples, so build
    # malformed elements that still carry a timestamp.
    commands = [
        ("ok", 1, 1, 0),
        (None, 1, 2, 0),           # key None
        ({"a": 1}, 1, 3, 0),       # key has no deterministic encoding
        ("k", 1, float("nan"), 0),  # offset not orderable
        ("k", 1, object, 0),        # offset not orderable
    ]

    def reasons(actual):
        got = sorted(r for _, r in actual)
        if len(got) != 4 or not all(got):
            raise BeamAssertException(f"unexpected invalid output {actual}")
        if not any("key is None" in r for r in got) or not any("deterministic" in r for r in got):
            raise BeamAssertException(f"reasons do not say why: {got}")

    got = run_upsert(commands, flavor=flavor, expected=[("ok", 1, 1, 0)],
                     expected_invalid=reasons)
    assert got["invalid"] == 4
    assert got["inserts"] == 1


def test_conflicting_prior_duplicates_are_reported(flavor):
    def one_conflict(actual):
        if len(actual) != 1 or "more than once" not in actual[0][1]:
            raise BeamAssertException(f"unexpected invalid output {actual}")

    run_upsert([("k", "c", 1, 0)], prior=[("k", "a"), ("k", "b")], flavor=flavor,
               expected=[("k", "b", -1, 0), ("k", "c", 1, 0)], expected_invalid=one_conflict)


def test_bad_settings_fail_at_construction(flavor):
    with pytest.raises(ValueError, match="flavor must be one of"):
        Upsert("fast")
    with pytest.raises(TypeError, match="prior must be a PCollection"):
        Upsert(flavor, prior=[("k", 1)])


def _reasons_name(needle, count):
    def check(actual):
        if len(actual) != count or not all(needle in reason for _, reason in actual):
            raise BeamAssertException(f"expected {count} invalid saying {needle!r}: {actual}")
    return check


def test_incomparable_offsets_go_to_invalid_and_the_key_keeps_going(flavor):
    commands = [
        ("k", "a", 5, 0), ("k", "b", "6", 0),        # 5 vs "6": a tie, numbers kept
        ("k", "c", 7, 1),
        ("k", "d", "8", 2),                          # str against the live number class
        ("t", "x", (1, "a"), 0), ("t", "y", (1, 2), 0),  # tuples of mixed part types
        ("t", "z", (2, 2), 1),
        ("s", "p", "1", 0), ("s", "q", "2", 0), ("s", "r", 3, 0),  # the majority is str
    ]
    expected, refused = reference(commands)
    assert refused == sorted([("k", "b", "6"), ("k", "d", "8"), ("t", "x", (1, "a")),
                              ("s", "r", 3)], key=repr)
    assert expected == sorted([
        ("k", "a", 1, 0), ("k", "a", -1, 1), ("k", "c", 1, 1),
        ("t", "y", 1, 0), ("t", "y", -1, 1), ("t", "z", 1, 1), ("s", "q", 1, 0)], key=repr)

    def check(actual):
        got = sorted((tuple(element) for element, _ in actual), key=repr)
        if got != refused or not all("does not order" in r for _, r in actual):
            raise BeamAssertException(f"unexpected invalid output {actual}")

    got = run_upsert(commands, flavor=flavor, expected=expected, expected_invalid=check)
    assert got["invalid"] == 4


def test_after_a_delete_any_offset_class_starts_afresh(flavor):
    commands = [("k", "a", 5, 0), ("k", None, 6, 1), ("k", "b", "x", 2), ("k", "c", "y", 3)]
    run_upsert(commands, flavor=flavor, expected=reference(commands)[0],
               expected_invalid=[])


def test_equal_offsets_pick_one_winner_whatever_the_order(flavor):
    rows = [("k", "b", 3, 0), ("k", None, 3, 0), ("k", 10, 3, 0), ("k", "a", 3, 0),
            ("k", "z", 2, 0), ("j", None, 1, 0), ("j", Decimal(1), 1, 0)]
    # A value beats a delete, even one whose type name sorts before "NoneType".
    expected = [("k", "b", 1, 0), ("j", Decimal(1), 1, 0)]
    assert reference(rows) == (sorted(expected, key=repr), [])
    for order in (rows, rows[::-1]):
        run_upsert(order, flavor=flavor, expected=expected)


def test_int_resume_at_is_microseconds_and_floats_are_refused(flavor):
    commands = [("k", "old", 1, 3), ("k", "new", 2, 5)]
    expected = [("k", "new", 1, 5)]
    got = run_upsert(commands, flavor=flavor, resume_at=5_000_000, expected=expected)
    assert got["dropped_before_resume"] == 1
    with pytest.raises(TypeError, match=r"microseconds.*Timestamp\(5.0\)"):
        Upsert(flavor, resume_at=5.0)
