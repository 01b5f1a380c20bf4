"""The first stage of every flavor: validate, drop what is persisted, key."""

from __future__ import annotations

from typing import Any, Optional

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders

from beam_upsert.metrics import UpsertCounters
from beam_upsert.model import Invalid, UpsertCommand, check_command, check_key, plain_key

INVALID_TAG = "invalid"

# Entries travelling from the prepare stage to the flavor, as plain tuples so
# a deterministic primitive coder handles them:
#   (CMD, time_micros, offset, value)   a command
#   (PRIOR, value)                      the snapshot's value for the key
#   (STATE, value, through, max_offset) what the stateful flavor keeps
#                                       for a key that holds a value
CMD, PRIOR, STATE = "c", "p", "s"

# Keyed state and grouping go by the key's encoded bytes, so the encoding is
# chosen here, explicitly and deterministically, rather than inferred.
KEY_CODER = coders.FastPrimitivesCoder().as_deterministic_coder("beam_upsert key")
encode_key = KEY_CODER.encode
decode_key = KEY_CODER.decode


def _encode_checked(key: Any) -> bytes:
    """The encoding of a key that passed ``check_key``."""
    return encode_key(plain_key(key))


# Keys and offsets of these exact types need no checking (check_key and
# check_offset accept every value of them); anything else takes the full check.
_PLAIN = frozenset((int, str, bytes))
_COMMAND_TYPES = frozenset((UpsertCommand, tuple))


class PrepareCommands(beam.DoFn):
    """Validates commands and keys them; malformed ones go to ``invalid``."""

    def __init__(self, resume_at_micros: Optional[int]) -> None:
        self._resume_at_micros = resume_at_micros

    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, element: Any, timestamp=beam.DoFn.TimestampParam):
        # The common case (scalar key and offset) skips the full check.
        if type(element) in _COMMAND_TYPES and len(element) == 3 and type(
                element[0]) in _PLAIN and type(element[2]) in _PLAIN:
            key, value, offset = element
            encode = encode_key
        else:
            command, reason = check_command(element)
            if command is None:
                self._counters.invalid.inc()
                yield pvalue.TaggedOutput(INVALID_TAG, Invalid(element, reason))
                return
            key, value, offset = command
            encode = _encode_checked
        micros = timestamp.micros
        if self._resume_at_micros is not None and micros < self._resume_at_micros:
            self._counters.dropped_before_resume.inc()
            return
        yield encode(key), (CMD, micros, offset, value)


class PreparePrior(beam.DoFn):
    """Validates snapshot pairs ``(key, value)`` and keys them."""

    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, element: Any):
        if not isinstance(element, tuple) or len(element) != 2:
            reason = f"prior snapshot element must be a (key, value) pair, got {type(element).__name__}"
        else:
            reason = check_key(element[0])
            if reason is None and element[1] is None:
                reason = "prior snapshot value is None (a snapshot holds only present keys)"
        if reason is not None:
            self._counters.invalid.inc()
            yield pvalue.TaggedOutput(INVALID_TAG, Invalid(element, "prior: " + reason))
            return
        self._counters.rehydrated.inc()
        yield _encode_checked(element[0]), (PRIOR, element[1])


class CountInvalid(beam.DoFn):
    """Counts invalid elements found after the prepare stage, passing them on."""

    def setup(self) -> None:
        self._counters = UpsertCounters()

    def process(self, invalid):
        self._counters.invalid.inc()
        yield invalid
