"""The per-key rule itself, including the late-command rule of the stateful flavor."""

import math

from beam_upsert.model import KeyState, apply_times, check_command, check_key


def test_late_newer_offset_is_applied_at_the_applied_time():
    state = KeyState("a", applied_through=5, max_offset=10)
    new, steps, late, stale = apply_times(state, [(4, 11, "b")], late_ok=True)
    assert steps == [(5, "a", "b")]
    assert (late, stale) == (1, 0)
    assert new == KeyState("b", 5, 11)


def test_late_equal_or_older_offset_is_dropped_and_counted():
    state = KeyState("a", applied_through=5, max_offset=10)
    new, steps, late, stale = apply_times(
        state, [(5, 10, "x"), (3, 9, "y"), (3, 2, "z")], late_ok=True)
    assert steps == []
    assert (late, stale) == (0, 3)
    assert new == state


def test_on_time_commands_advance_the_applied_time():
    new, steps, late, stale = apply_times(KeyState(), [(7, 1, "a"), (9, 0, "b")], late_ok=True)
    assert steps == [(7, None, "a"), (9, "a", "b")]
    assert new == KeyState("b", 9, 1)
    assert (late, stale) == (0, 0)


def test_check_key_and_command_reasons():
    assert check_key(("a", 1, b"x")) is None
    assert "finite" in check_key(math.inf)
    assert "deterministic" in check_key(["list"])
    assert check_command(("k", 1))[1].startswith("expected UpsertCommand")
    assert "not orderable" in check_command(("k", 1, {}))[1]
    assert check_command(("k", None, 3))[0] == ("k", None, 3)
