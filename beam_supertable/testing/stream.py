"""``upsert_stream()``: a ``TestStream`` of upsert commands (``beam_supertable.testing``)."""

from __future__ import annotations

import numbers
from typing import Any, Hashable, List, Tuple, Union

from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

from beam_supertable.transforms.upsert_table import COMMIT_SLOT_US
from beam_upsert.model import UpsertCommand

__all__ = ["UpsertStream", "upsert_stream"]

Seconds = Union[int, float, Timestamp]


def _timestamp(value: Any, what: str) -> Timestamp:
    if isinstance(value, Timestamp):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return Timestamp.of(value)
    raise TypeError(f"upsert_stream: {what} must be seconds (int or float) or an apache_beam "
                    f"Timestamp, got {type(value).__name__} {value!r}")


class UpsertStream:
    """Builds a ``TestStream`` of ``UpsertCommand`` elements with watermark steps.

    Each method returns the builder, so the steps chain. Commands added one
    after another go out as one batch of elements; a watermark or
    processing-time step ends the batch.

    Example::

        stream = (upsert_stream()
                  .command("k", "a", offset=1, at=5)
                  .advance_watermark(to=4)          # nothing at 5 applies yet
                  .command("k", "b", offset=2, at=5)
                  .delete("j", offset=1, at=6)
                  .advance_watermark(to=10)
                  .build())                         # then to infinity
        changes = p | stream | Upsert()
    """

    def __init__(self) -> None:
        self._events: List[Tuple[str, Any]] = []
        self._watermark = MIN_TIMESTAMP
        self._latest = MIN_TIMESTAMP     # the greatest element time

    def command(self, key: Hashable, value: Any, offset: Any, *, at: Seconds) -> "UpsertStream":
        """Adds ``UpsertCommand(key, value, offset)`` at event time ``at``.

        Args:
            value: the new value (for ``UpsertToSupertable``, a row dict);
                ``None`` deletes.
            at: the command's time: seconds since the epoch or a Timestamp.
                A time at or below the watermark makes the command late.
        """
        return self.element(UpsertCommand(key, value, offset), at=at)

    def delete(self, key: Hashable, offset: Any, *, at: Seconds) -> "UpsertStream":
        """Adds a delete of ``key``: ``UpsertCommand(key, None, offset)`` at ``at``."""
        return self.command(key, None, offset, at=at)

    def commands(self, items) -> "UpsertStream":
        """Adds ``(key, value, offset, at)`` tuples, in one batch with the commands before."""
        for i, item in enumerate(items):
            if not isinstance(item, tuple) or len(item) != 4:
                raise ValueError(f"upsert_stream: commands item {i} must be a tuple "
                                 f"(key, value, offset, at), got {item!r}")
            key, value, offset, at = item
            self.command(key, value, offset, at=at)
        return self

    def element(self, element: Any, *, at: Seconds) -> "UpsertStream":
        """Adds any element at ``at``, e.g. a malformed command for an invalid-output test."""
        when = _timestamp(at, "at")
        if not when < MAX_TIMESTAMP:
            raise ValueError(f"upsert_stream: at={at!r} is not before the end of time")
        self._latest = max(self._latest, when)
        if self._events and self._events[-1][0] == "elements":
            self._events[-1][1].append(TimestampedValue(element, when))
        else:
            self._events.append(("elements", [TimestampedValue(element, when)]))
        return self

    def advance_watermark(self, *, to: Seconds) -> "UpsertStream":
        """Moves the watermark to ``to`` (seconds or a Timestamp): commands at or
        below it are complete, so the stateful flavor applies them.

        Raises:
            ValueError: ``to`` is not past the previous watermark, or not a
                whole millisecond (the runners' watermark unit).
        """
        when = _timestamp(to, "to")
        if when.micros % 1000:
            raise ValueError(f"upsert_stream: advance_watermark(to={to!r}) is not a whole "
                             "millisecond; watermarks move in milliseconds")
        if not when > self._watermark:
            raise ValueError(f"upsert_stream: advance_watermark(to={to!r}) must move past the "
                             f"watermark {self._watermark}")
        self._watermark = when
        self._events.append(("watermark", when))
        return self

    def advance_processing_time(self, by: Union[int, float, Duration]) -> "UpsertStream":
        """Moves processing time forward by ``by`` seconds (whole milliseconds, > 0)."""
        if isinstance(by, Duration):
            step = by
        elif isinstance(by, numbers.Real) and not isinstance(by, bool):
            step = Duration.of(by)
        else:
            raise TypeError(f"upsert_stream: advance_processing_time(by=...) must be seconds "
                            f"or a Duration, got {type(by).__name__} {by!r}")
        if step.micros <= 0 or step.micros % 1000:
            raise ValueError(f"upsert_stream: advance_processing_time(by={by!r}) must be a "
                             "positive whole number of milliseconds")
        self._events.append(("processing", step))
        return self

    def build(self, *, to_infinity: bool = True, settle: bool = True) -> TestStream:
        """The ``TestStream``; it ends by moving the watermark to infinity, which
        completes the stream, unless ``to_infinity`` is False.

        With ``settle`` (and ``to_infinity``), the watermark first moves past
        the commit slot of the latest element and the last watermark step
        (``UpsertToSupertable`` commits once per second of event time), so
        every timer the commands set fires while the stream still runs: on
        the streaming DirectRunner, output that only the final jump to
        infinity fires can miss ``assert_that``.

        The builder is left as it was: ``build`` may be called again.
        """
        stream = TestStream()
        for kind, arg in self._events:
            if kind == "elements":
                stream = stream.add_elements(list(arg))
            elif kind == "watermark":
                stream = stream.advance_watermark_to(arg)
            else:
                stream = stream.advance_processing_time(arg)
        if to_infinity:
            latest = max(self._latest, self._watermark)
            if settle and latest > MIN_TIMESTAMP:
                # Just past the end of the slot: a timer set at the slot's end fires.
                past = Timestamp(micros=(latest.micros // COMMIT_SLOT_US + 1) * COMMIT_SLOT_US
                                 + 1000)
                if past < MAX_TIMESTAMP:
                    stream = stream.advance_watermark_to(past)
            stream = stream.advance_watermark_to_infinity()
        return stream


def upsert_stream() -> UpsertStream:
    """A new :class:`UpsertStream` builder."""
    return UpsertStream()
