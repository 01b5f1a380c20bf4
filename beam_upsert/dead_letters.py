"""Dead letters as JSON: one deterministic encoding for every transform's ``Invalid``.

Every transform of ``beam_upsert`` and ``beam_supertable`` sends what it
refuses to its ``invalid`` output as ``Invalid(element, reason)``;
:func:`invalid_to_json` writes one as a line of JSON that any strict parser
reads back, encoding a value the same way wherever it sits (at the top,
inside a command's value, inside a list).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from typing import Any, Mapping

import numpy as np
from apache_beam.utils.timestamp import Timestamp

from beam_upsert.model import Invalid, UpsertCommand, UpsertError

__all__ = ["invalid_to_json", "to_json_value"]

_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _float(x: float) -> Any:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else _NON_FINITE[x]


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return _dumps(to_json_value(key))


def _dumps(value: Any) -> str:
    # ASCII only: a lone surrogate in a str still makes text every file can hold.
    return json.dumps(value, sort_keys=True, allow_nan=False, separators=(", ", ": "))


def to_json_value(obj: Any) -> Any:
    """``obj`` as plain JSON data (dicts, lists, str, int, float, bool, None), by
    the rules :func:`invalid_to_json` applies to a dead letter's element."""
    # The model's named tuples first: they are tuples too.
    if isinstance(obj, UpsertCommand):
        return {"key": to_json_value(obj.key), "value": to_json_value(obj.value),
                "offset": to_json_value(obj.offset)}
    if isinstance(obj, Invalid):
        return {"element": to_json_value(obj.element), "reason": str(obj.reason)}
    if isinstance(obj, UpsertError):
        return {"error": obj.message}
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, int):
        return int(obj)   # an int subclass (an IntEnum) as its number
    if isinstance(obj, float):
        return _float(float(obj))
    if isinstance(obj, np.generic):
        return to_json_value(obj.item())
    if isinstance(obj, Mapping):
        # Sorted, so that two keys of one text (1 and "1") keep the same one
        # whatever the dict's order.
        items = sorted(((_key_text(k), to_json_value(v)) for k, v in obj.items()),
                       key=lambda kv: (kv[0], _dumps(kv[1])))
        return dict(items)
    if isinstance(obj, (list, tuple)):
        return [to_json_value(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_json_value(obj.tolist())
    if isinstance(obj, (set, frozenset)):
        return [json.loads(t) for t in sorted(_dumps(to_json_value(v)) for v in obj)]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", "backslashreplace")
    if isinstance(obj, (datetime.datetime, datetime.date, datetime.time)):
        return obj.isoformat()
    if isinstance(obj, datetime.timedelta):
        return obj.total_seconds()
    if isinstance(obj, Timestamp):
        return obj.to_rfc3339()
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    as_py = getattr(obj, "as_py", None)   # a pyarrow scalar
    if callable(as_py):
        return to_json_value(as_py())
    to_pylist = getattr(obj, "to_pylist", None)   # a pyarrow array, table or batch
    if callable(to_pylist):
        return to_json_value(to_pylist())
    return repr(obj)


def invalid_to_json(invalid: Any) -> str:
    """One dead letter as one line of JSON: ``{"element": ..., "reason": "..."}``.

    The element is encoded the same way wherever a value sits (at the top,
    inside a command's value, inside a list), so a value and an error are
    told apart by their shape alone:

    * dicts become objects (a key that is not a string becomes the JSON text
      of the key; of two keys with one text, the one with the greater
      encoded value is kept), tuples, lists, sets and numpy arrays become
      arrays (sets sorted by their encoding);
    * ``UpsertCommand`` becomes ``{"key", "value", "offset"}``, ``Invalid``
      ``{"element", "reason"}`` and ``UpsertError`` ``{"error": message}``;
    * bytes become text (UTF-8; bytes that are not UTF-8 are escaped as
      ``\\xNN``), datetimes, dates and times ISO-8601 text, Beam timestamps
      RFC 3339 text, timedeltas seconds, ``Decimal`` its exact text;
    * numpy scalars become numbers or booleans; the floats NaN, infinity and
      minus infinity (which JSON lacks) become the strings ``"NaN"``,
      ``"Infinity"`` and ``"-Infinity"``;
    * pyarrow scalars and arrays their Python values; anything else its
      ``repr``.

    Keys are sorted, separators fixed and the text ASCII (other characters
    escaped), so one dead letter always encodes to one string.

    Example::

        _ = result.invalid | beam.Map(invalid_to_json) | beam.io.WriteToText(path)

    Args:
        invalid: an ``Invalid(element, reason)`` (or any ``(element, reason)``
            pair) from a transform's ``invalid`` output.

    Returns:
        The JSON text, keys sorted: equal dead letters give equal strings,
        and ``json.loads`` (strict: no NaN) reads every one back.

    Raises:
        TypeError: ``invalid`` is not an ``(element, reason)`` pair.
    """
    if not isinstance(invalid, Invalid):
        if not isinstance(invalid, tuple) or len(invalid) != 2:
            raise TypeError(f"invalid_to_json: expected Invalid(element, reason), got "
                            f"{type(invalid).__name__}")
        invalid = Invalid(*invalid)
    return _dumps({"element": to_json_value(invalid.element), "reason": str(invalid.reason)})
