"""UpsertToSupertable's streaming path: tombstones, the horizon, too-late commands."""

import uuid

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.display import DisplayData
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable, UpsertToSupertable
from beam_supertable.testing import assert_table_rows
from beam_upsert import UpsertCommand
from tests.beam_upsert.test_tombstones import highest_offset_per_key

D = 4
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("emb", pa.list_(pa.float32(), D))])


def _row(i, name):
    return {"id": i, "name": name, "emb": [float(i % 7), 1.0, 0.0, 0.5]}


def _stream(events):
    """events: ("add", [(key, name | None, offset, seconds)]) or ("wm", seconds)."""
    ts = TestStream()
    for kind, arg in events:
        if kind == "add":
            ts = ts.add_elements([
                TimestampedValue(UpsertCommand(k, None if n is None else _row(k, n), o), t)
                for k, n, o, t in arg])
        else:
            ts = ts.advance_watermark_to(arg)
    return ts.advance_watermark_to_infinity()


def _run(uri, events, expected_invalid=None, **kwargs):
    p = TestPipeline(options=PipelineOptions(streaming=True))
    result = (p | _stream(events)
              | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", **kwargs)
              .with_invalid_output())
    if expected_invalid is not None:
        assert_that(result.invalid | beam.Map(lambda i: (tuple(i.element)[:1],
                                                         i.reason.split(":")[0])),
                    equal_to(expected_invalid), label="invalid")
    p.run().wait_until_finish()


def _assert_live(uri, pairs):
    """The table's live rows are ``(id, name)`` pairs, one per key."""
    assert_table_rows(uri, [{"id": k, "name": n} for k, n in pairs], columns=["id", "name"],
                      key="id")


def _uri():
    return f"memory://upsert-tombstones/{uuid.uuid4().hex}"


SCENARIO = [
    ("add", [(1, "v1", 1, 1)]),
    ("add", [(1, None, 3, 2)]),
    ("wm", 10),
    ("add", [(1, "v0", 2, 1)]),        # late, older offset than the delete
    ("wm", 11),
]


def test_a_stale_late_insert_does_not_resurrect_a_deleted_key():
    uri = _uri()
    _run(uri, SCENARIO, expected_invalid=[])
    _assert_live(uri, [])


def test_a_newer_late_command_is_applied():
    uri = _uri()
    _run(uri, SCENARIO[:3] + [("add", [(1, "v9", 5, 1)]), ("wm", 11)])
    _assert_live(uri, [(1, "v9")])


def test_after_the_horizon_the_late_insert_is_too_late():
    uri = _uri()
    _run(uri, SCENARIO, tombstone_retention=1, expected_invalid=[((1,), "too late")])
    _assert_live(uri, [])


def test_a_forgotten_key_read_back_from_an_older_version_is_written_again():
    # Key 1 holds "v1" in the version the job pins. The job deletes it; the
    # tombstone is dropped after the horizon; a later command puts "v1"
    # again. The pinned version still shows "v1", so nothing would change,
    # but the table no longer holds it: the key must be written.
    uri = _uri()
    Supertable.create(uri, SCHEMA, primary_key="id")
    Supertable.open(uri).upsert([_row(1, "v1")])
    _run(uri, [("add", [(1, None, 3, 2)]), ("wm", 10), ("add", [(1, "v1", 4, 12)]),
               ("wm", 13)], tombstone_retention=1)
    _assert_live(uri, [(1, "v1")])


def test_zero_retention_keeps_the_old_behaviour():
    uri = _uri()
    _run(uri, SCENARIO, tombstone_retention=0)
    _assert_live(uri, [(1, "v0")])


def test_tombstone_retention_is_validated_and_displayed():
    with pytest.raises(ValueError, match=r"UpsertToSupertable: tombstone_retention must be "
                                         r">= 0.*got -5"):
        UpsertToSupertable("memory://x", tombstone_retention=-5)
    with pytest.raises(TypeError, match="UpsertToSupertable: tombstone_retention"):
        UpsertToSupertable("memory://x", tombstone_retention="1h")
    shown = {i.key: i.value for i in DisplayData.create_from(
        UpsertToSupertable("memory://x", tombstone_retention=Duration(seconds=120))).items}
    assert shown["tombstone_retention"] == "120 s"


# -- random arrival orders and watermark steps -------------------------------------------
@st.composite
def arrivals(draw):
    """Commands whose offsets follow their times, in a random arrival order
    with random watermark steps: ``(commands, events)``."""
    n = draw(st.integers(1, 10))
    raw = [(draw(st.integers(0, 3)), draw(st.booleans()), draw(st.integers(0, 8)))
           for _ in range(n)]
    order = draw(st.permutations(range(n)))
    ranked = sorted(range(n), key=lambda i: (raw[i][2], order[i]))
    commands = [None] * n
    for offset, i in enumerate(ranked, 1):
        key, gone, time = raw[i]
        commands[i] = (key, None if gone else f"{key}@{offset}", offset, time)
    events, watermark = [], 0
    for i in draw(st.permutations(range(n))):
        events.append(("add", [commands[i]]))
        if watermark < 10 and draw(st.booleans()):
            watermark = draw(st.integers(watermark + 1, 10))
            events.append(("wm", watermark))
    return commands, events + [("wm", 11)]


def _check(commands, events):
    uri = _uri()
    _run(uri, events, expected_invalid=[])
    _assert_live(uri, highest_offset_per_key(commands))


_PROPERTY = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow],
             "phases": (Phase.explicit, Phase.reuse, Phase.generate)}


@settings(max_examples=3, **_PROPERTY)
@given(arrivals())
def test_late_arrivals_leave_the_highest_offset_per_key(workload):
    _check(*workload)


@pytest.mark.slow
@settings(max_examples=12, **_PROPERTY)
@given(arrivals())
def test_late_arrivals_leave_the_highest_offset_per_key_on_many_workloads(workload):
    _check(*workload)
