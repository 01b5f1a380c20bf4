"""The per-key rule itself, including the late-command rule of the stateful flavor."""

import itertools
import math
from decimal import Decimal

import pytest
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.model import (
    KeyState, apply_times, check_command, check_key, offset_class, resume_micros, winner)


def test_late_newer_offset_is_applied_at_the_applied_time():
    state = KeyState("a", applied_through=5, max_offset=10)
    got = apply_times(state, [(4, 11, "b")], late_ok=True)
    assert got.steps == [(5, "a", "b")]
    assert (got.late_applied, got.stale_dropped) == (1, 0)
    assert got.state == KeyState("b", 5, 11)


def test_late_equal_or_older_offset_is_dropped_and_counted():
    state = KeyState("a", applied_through=5, max_offset=10)
    got = apply_times(state, [(5, 10, "x"), (3, 9, "y"), (3, 2, "z")], late_ok=True)
    assert got.steps == []
    assert (got.late_applied, got.stale_dropped) == (0, 3)
    assert got.state == state


def test_on_time_commands_advance_the_applied_time():
    got = apply_times(KeyState(), [(7, 1, "a"), (9, 0, "b")], late_ok=True)
    assert got.steps == [(7, None, "a"), (9, "a", "b")]
    assert got.state == KeyState("b", 9, 1)
    assert (got.late_applied, got.stale_dropped, got.invalid) == (0, 0, [])


def test_check_key_and_command_reasons():
    assert check_key(("a", 1, b"x")) is None
    assert "finite" in check_key(math.inf)
    assert "deterministic" in check_key(["list"])
    assert check_command(("k", 1))[1].startswith("expected UpsertCommand")
    assert "not orderable" in check_command(("k", 1, {}))[1]
    assert check_command(("k", None, 3))[0] == ("k", None, 3)


def test_decimal_nan_offsets_are_refused():
    # A Decimal NaN raises when compared (a signalling one even on ==).
    assert "NaN" in check_command(("k", 1, Decimal("NaN")))[1]
    assert "NaN" in check_command(("k", 1, (1, Decimal("sNaN"))))[1]
    assert check_command(("k", 1, Decimal("1.5")))[0] is not None


def test_offset_classes():
    assert offset_class(5) == offset_class(True) == offset_class(2.5) == offset_class(Decimal(1))
    assert len({offset_class(5), offset_class("5"), offset_class(b"5")}) == 3
    assert offset_class((1, "a")) != offset_class((1, 2))
    assert offset_class((1, 2.5)) == offset_class((3, 4))
    assert offset_class((1,)) != offset_class((1, 2))


def _all_orders(state, commands, **kw):
    # Refused commands may come out in any order; everything else may not differ.
    results = set()
    for order in itertools.permutations(commands):
        got = apply_times(state, list(order), key="k", **kw)
        results.add(repr(got._replace(invalid=sorted(got.invalid, key=repr))))
    assert len(results) == 1, results
    return apply_times(state, commands, key="k", **kw)


def test_mixed_offsets_at_one_time_keep_the_majority_class():
    got = _all_orders(KeyState(), [(1, 5, "a"), (1, "6", "b"), (1, "7", "c")])
    assert got.steps == [(1, None, "c")]
    assert [(o, v) for _, o, v, _ in got.invalid] == [(5, "a")]
    assert "does not order" in got.invalid[0][3] and "'k'" in got.invalid[0][3]


def test_mixed_offsets_on_a_tie_keep_numbers_then_str_then_bytes_then_tuples():
    got = _all_orders(KeyState(), [(1, 5, "num"), (1, "6", "str")])
    assert got.steps == [(1, None, "num")]
    got = _all_orders(KeyState(), [(1, b"6", "bytes"), (1, "6", "str"), (1, (1, "a"), "t")])
    assert got.steps == [(1, None, "str")]
    got = _all_orders(KeyState(), [(1, (1, "a"), "ts"), (1, (1, 2), "tn")])
    assert got.steps == [(1, None, "tn")]
    assert len(got.invalid) == 1 and "tuple(number, str)" in got.invalid[0][3]


def test_a_live_key_refuses_offsets_of_another_class():
    got = _all_orders(KeyState(), [(1, 5, "a"), (2, "6", "b"), (2, 4, "c"), (3, (1, 2), "d")])
    assert got.steps == [(1, None, "a"), (2, "a", "c")]
    assert sorted(repr(o) for _, o, _, _ in got.invalid) == ["'6'", "(1, 2)"]
    assert got.state.max_offset == 5


def test_a_late_command_of_another_class_is_refused_not_raised():
    state = KeyState("a", applied_through=5, max_offset=10)
    got = apply_times(state, [(4, "11", "b")], key="k", late_ok=True)
    assert got.steps == [] and got.state == state
    assert [(t, o, v) for t, o, v, _ in got.invalid] == [(4, "11", "b")]


def test_equal_offsets_pick_one_winner_whatever_the_order():
    commands = [(1, 3, "b"), (1, 3, None), (1, 3, 10), (1, 3, "a"), (1, 2, "z")]
    got = _all_orders(KeyState(), commands)
    # A value beats a delete; then the greatest (type name, repr): "str" > "int".
    assert got.steps == [(1, None, "b")]
    assert winner([(3, None), (3.0, 2)]) == (3.0, 2)


def test_a_key_without_a_value_keeps_no_state():
    got = apply_times(KeyState("p"), [(1, 5, "a"), (2, 6, None)], key="k", late_ok=True)
    assert got.state == KeyState()
    got = apply_times(KeyState(), [(1, 5, None)], key="k", late_ok=True)
    assert got.state == KeyState()


def test_after_a_delete_the_offset_class_starts_afresh():
    # With a tombstone, "x" would not order against the deleted key's 6.
    got = _all_orders(KeyState(), [(1, 5, "a"), (2, 6, None), (3, "x", "b")])
    assert got.steps == [(1, None, "a"), (2, "a", None), (3, None, "b")]
    assert got.invalid == []


def test_after_a_delete_a_late_command_is_fresh():
    deleted = apply_times(KeyState(), [(5, 10, "a"), (6, 11, None)], key="k", late_ok=True)
    # Late (time 4) and older than the delete: with nothing kept it is fresh,
    # applied at its own time, as the grouped flavor would apply it.
    got = apply_times(deleted.state, [(4, 9, "b")], key="k", late_ok=True)
    assert got.steps == [(4, None, "b")]
    assert (got.late_applied, got.stale_dropped) == (0, 0)


def test_resume_micros_has_one_rule():
    assert resume_micros(None, where="x") is None
    assert resume_micros(5_000_000, where="x") == 5_000_000
    assert resume_micros(Timestamp(5), where="x") == 5_000_000
    with pytest.raises(TypeError, match=r"Upsert: resume_at .*microseconds.*Timestamp\(5.0\)"):
        resume_micros(5.0, where="Upsert")
    for bad in (True, "5", Decimal(5)):
        with pytest.raises(TypeError, match="resume_at"):
            resume_micros(bad, where="x")
    with pytest.raises(ValueError, match="range"):
        resume_micros(10**30, where="x")


def test_after_a_delete_a_tuple_offset_of_another_shape_starts_afresh():
    """A tombstone of (2, "y") and a later (2, 2): tuples of one length, other classes."""
    state = KeyState(None, applied_through=2, max_offset=(2, "y"))
    got = apply_times(state, [(3, (2, 2), "a"), (4, (3, 3), "b")], tombstones=True)
    assert got.steps == [(3, None, "a"), (4, "a", "b")]
    assert got.state == KeyState("b", 4, (3, 3))
