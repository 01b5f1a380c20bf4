"""Reading commands and snapshots, writing changelogs: JSON lines or Parquet.

A command line is ``{"key": ..., "value": ..., "offset": ..., "time": ...}``
where ``time`` is seconds since the epoch (a number) or an ISO-8601 string,
``value`` null deletes, and ``{"error": "..."}`` in place of ``value`` marks a
value that failed to decode (it becomes an ``UpsertError``). A snapshot line
is ``{"key": ..., "value": ...}``. Parquet inputs carry the same columns.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_upsert import Invalid, UpsertCommand, UpsertError, invalid_to_json

BAD_TAG = "bad"
JOB_NAMESPACE = "pipelines"


def is_parquet(path: str) -> bool:
    return path.endswith((".parquet", ".pq"))


def parse_time(raw: Any) -> Timestamp:
    if isinstance(raw, bool) or raw is None:
        raise ValueError(f"time must be seconds or an ISO-8601 string, got {raw!r}")
    if isinstance(raw, (int, float)):
        return Timestamp.of(raw)
    if isinstance(raw, datetime.datetime):
        return Timestamp.from_utc_datetime(
            raw if raw.tzinfo else raw.replace(tzinfo=datetime.timezone.utc))
    return Timestamp.from_rfc3339(str(raw))


def parse_key(raw: Any) -> Any:
    # JSON has no tuples; a composite key arrives as a list.
    return tuple(raw) if isinstance(raw, list) else raw


def _value(raw: Any) -> Any:
    # Values travel as canonical JSON text: they compare by content, pass
    # through Beam's coders, and decode back to what the input held.
    return None if raw is None else json.dumps(raw, sort_keys=True)


def command_row(element: Any) -> dict:
    """A command as a dict (a JSON line, or a Parquet row already one), with
    its ``key``, ``offset`` and ``time``; ``ValueError`` naming what is wrong."""
    row = json.loads(element) if isinstance(element, (str, bytes)) else element
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    missing = [f for f in ("key", "offset", "time") if f not in row]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    return row


class ParseCommand(beam.DoFn):
    """A JSON line or a Parquet row dict -> a timestamped UpsertCommand."""

    def setup(self):
        self._read = Metrics.counter(JOB_NAMESPACE, "commands_read")

    def process(self, element):
        self._read.inc()
        try:
            row = command_row(element)
            if row.get("error") is not None:
                value = UpsertError(str(row["error"]))
            else:
                value = _value(row.get("value"))
            yield TimestampedValue(
                UpsertCommand(parse_key(row["key"]), value, row["offset"]), parse_time(row["time"]))
        except ValueError as exc:
            Metrics.counter(JOB_NAMESPACE, "unparseable").inc()
            yield pvalue.TaggedOutput(BAD_TAG, Invalid(element, f"unparseable command: {exc}"))


class ParseSnapshot(beam.DoFn):
    def process(self, element):
        try:
            row = json.loads(element) if isinstance(element, (str, bytes)) else element
            if not isinstance(row, dict) or "key" not in row:
                raise ValueError("expected an object with a key field")
            yield parse_key(row["key"]), _value(row.get("value"))
        except ValueError as exc:
            Metrics.counter(JOB_NAMESPACE, "unparseable").inc()
            yield pvalue.TaggedOutput(BAD_TAG, Invalid(element, f"unparseable snapshot row: {exc}"))


def read_rows(p, label: str, path: str):
    if is_parquet(path):
        return p | label >> beam.io.ReadFromParquet(path)
    return p | label >> beam.io.ReadFromText(path)


def _json_default(obj):
    if isinstance(obj, UpsertError):
        return {"error": obj.message}
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "backslashreplace")
    return repr(obj)


class ChangeToRow(beam.DoFn):
    """A change -> ``{"key", "value", "error", "diff", "time"}``.

    ``value`` is the value as the input held it (an object, a list, a scalar;
    null for an error); ``error`` the message of a value that failed to
    decode, else null: values and errors are encoded the same way in JSON
    lines and in Parquet.
    """

    def process(self, change, timestamp=beam.DoFn.TimestampParam):
        error = change.value.message if isinstance(change.value, UpsertError) else None
        value = None if error is not None or change.value is None else json.loads(change.value)
        yield {
            "key": change.key,
            "value": value,
            "error": error,
            "diff": change.diff,
            "time": timestamp.to_rfc3339(),
        }


CHANGE_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("value", pa.string()),
    ("error", pa.string()),
    ("diff", pa.int8()),
    ("time", pa.timestamp("us", tz="UTC")),
])


def change_to_parquet_row(row: dict) -> dict:
    """Parquet needs one type per column: keys and values go as JSON text."""
    return {
        "key": row["key"] if isinstance(row["key"], str) else json.dumps(row["key"], default=_json_default),
        "value": None if row["value"] is None else json.dumps(row["value"], sort_keys=True,
                                                               default=_json_default),
        "error": row["error"],
        "diff": row["diff"],
        "time": datetime.datetime.fromisoformat(row["time"].replace("Z", "+00:00")),
    }


def to_json(row: Any) -> str:
    """One output line: a dead letter as ``beam_upsert.invalid_to_json`` encodes it."""
    if isinstance(row, Invalid):
        return invalid_to_json(row)
    return json.dumps(row, default=_json_default, sort_keys=True)
