"""``ReadChangesFromSupertable``: a table's changes in a Beam pipeline, bounded and tailing."""

import collections
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.window import TimestampedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import (
    ReadChangesFromSupertable, Supertable, UpsertToSupertable, VersionNotFoundError)
from beam_upsert import Upsert, UpsertCommand
from beam_upsert.model import Change

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])


def _keyed(tmp_path, name="t"):
    return Supertable.create(str(tmp_path / name), SCHEMA, primary_key="id", iceberg=False)


class _WithTime(beam.DoFn):
    def process(self, change, ts=beam.DoFn.TimestampParam):
        yield change, ts.micros


def _as_changes(table, key):
    return [Change(r[key] if key else r["_id"], {"id": r["id"], "label": r["label"]},
                   r["_change"]) for r in table.to_pylist()]


def test_a_bounded_read_emits_the_table_changes_at_their_commit_times(tmp_path):
    t = _keyed(tmp_path)
    t.upsert(pa.table({"id": [1, 2, 3], "label": ["a", "b", "c"]}))
    t.upsert(pa.table({"id": [2], "label": ["B"]}))
    t.delete(pc.field("id") == 3)
    want = [(c, r["_commit_timestamp"].timestamp() * 1e6)
            for c, r in zip(_as_changes(t.changes(0), "id"), t.changes(0).to_pylist())]
    p = TestPipeline()
    out = p | ReadChangesFromSupertable(t.uri, start_version=0, end_version="latest")
    assert_that(out | beam.ParDo(_WithTime()), equal_to([(c, int(ts)) for c, ts in want]))
    p.run().wait_until_finish()


def test_a_keyless_table_keys_its_changes_by_id_and_reads_a_version_range(tmp_path):
    t = Supertable.create(str(tmp_path / "t"), SCHEMA, iceberg=False)
    t.append(pa.table({"id": [1, 2], "label": ["a", "b"]}))
    t.append(pa.table({"id": [3], "label": ["c"]}))
    t.delete(pc.field("id") == 1)
    p = TestPipeline()
    out = p | ReadChangesFromSupertable(t.uri, start_version=1, end_version=2,
                                        columns=["label"])
    want = [Change(r["_id"], {"label": r["label"]}, r["_change"])
            for r in t.changes(1, 2).to_pylist()]
    assert len(want) == 1
    assert_that(out, equal_to(want))
    p.run().wait_until_finish()


def test_a_filter_keeps_the_matching_changes(tmp_path):
    t = _keyed(tmp_path)
    t.upsert(pa.table({"id": [1, 20], "label": ["a", "b"]}))
    t.upsert(pa.table({"id": [1, 20], "label": ["A", "B"]}))
    p = TestPipeline()
    out = p | ReadChangesFromSupertable(t.uri, start_version=0, end_version=2,
                                        filter=pc.field("id") < 10)
    assert_that(out, equal_to([Change(1, {"id": 1, "label": "a"}, 1),
                               Change(1, {"id": 1, "label": "a"}, -1),
                               Change(1, {"id": 1, "label": "A"}, 1)]))
    p.run().wait_until_finish()


def test_mistakes_are_refused_when_the_pipeline_is_built(tmp_path):
    t = _keyed(tmp_path)
    for i in range(4):
        t.upsert(pa.table({"id": [i], "label": ["x"]}))
    t.vacuum(retain_versions=2, older_than=0)
    with pytest.raises(VersionNotFoundError, match="oldest version still readable is 3"):
        ReadChangesFromSupertable(t.uri, start_version=1)
    with pytest.raises(VersionNotFoundError, match="start_version 9 does not exist yet"):
        ReadChangesFromSupertable(t.uri, start_version=9)
    with pytest.raises(ValueError, match="start_version 4 is after end_version 3"):
        ReadChangesFromSupertable(t.uri, start_version=4, end_version=3)
    with pytest.raises(ValueError, match="end_version must be an int >= 0, 'latest' or None"):
        ReadChangesFromSupertable(t.uri, start_version=3, end_version="newest")
    with pytest.raises(ValueError, match="poll_interval must be a number of seconds > 0"):
        ReadChangesFromSupertable(t.uri, start_version=3, poll_interval=0)
    with pytest.raises(Exception, match=r"unknown column\(s\) \['nope'\]"):
        ReadChangesFromSupertable(t.uri, start_version=3, columns=["nope"])


def test_tailing_emits_each_version_as_it_lands_into_event_time_windows(tmp_path):
    # A streaming pipeline tails until the version it was asked for lands,
    # while a writer commits; the changes group in event-time sessions.
    t = _keyed(tmp_path)
    start = t.version

    def writer():
        for i in range(4):
            time.sleep(0.4)
            t.upsert(pa.table({"id": [i % 2], "label": [str(i)]}))

    thread = threading.Thread(target=writer)
    thread.start()
    p = TestPipeline(options=PipelineOptions(["--streaming"]))
    out = p | ReadChangesFromSupertable(t.uri, start_version=start, end_version=start + 4,
                                        poll_interval=0.05)
    per_key = (out | beam.WindowInto(window.Sessions(60))
               | beam.Map(lambda c: (c.key, (c.value["label"], c.diff)))
               | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs))))
    assert_that(per_key, equal_to([
        (0, [("0", -1), ("0", 1), ("2", 1)]), (1, [("1", -1), ("1", 1), ("3", 1)])]))
    p.run().wait_until_finish()
    thread.join()


def test_a_tailing_reader_sees_every_version_of_racing_writers_once_in_order(tmp_path):
    # Real processes: two writers upsert and delete overlapping keys while a
    # third process tails the table with no end. Each key's changes arrive
    # once each, in the order of the versions that made them.
    t = _keyed(tmp_path)
    start = t.version
    out = tmp_path / "changes.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT)
    reader = subprocess.Popen([sys.executable, "-m", "tests.beam_supertable.changes_proc",
                               t.uri, str(start), str(out)], cwd=ROOT, env=env,
                              stderr=subprocess.DEVNULL)
    writers = [subprocess.Popen(
        [sys.executable, "-m", "tests.beam_supertable.keyed_proc", t.uri, "null", name,
         "8", "12", "1"], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True) for name in ("w1", "w2")]
    try:
        for w in writers:
            assert w.stdout.readline().strip() == "READY"
        for w in writers:
            w.stdin.write("go\n")
            w.stdin.flush()
        for w in writers:
            assert w.wait(timeout=120) == 0
        want = collections.defaultdict(list)
        for r in Supertable.open(t.uri).changes(start).to_pylist():
            want[r["id"]].append([{"id": r["id"], "label": r["label"]}, r["_change"]])
        total = sum(len(v) for v in want.values())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = out.read_text().splitlines() if out.exists() else []
            if len(lines) >= total:
                break
            time.sleep(0.2)
        time.sleep(0.5)   # anything emitted twice would land now
    finally:
        reader.kill()
        reader.wait()
    got = collections.defaultdict(list)
    for line in out.read_text().splitlines():
        key, row, diff = json.loads(line)
        got[key].append([row, diff])
    assert dict(got) == dict(want)


# -- the table is a faithful persisted form of the upsert collection ----------------------
BATCHES = st.lists(st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.sampled_from(
    "abc")), st.integers(0, 3)), min_size=1, max_size=8), min_size=1, max_size=3)


def _commands(batches):
    """Each batch a second later than the one before; offsets unique."""
    out, offset = [], 0
    for b, batch in enumerate(batches):
        for key, label, dt in batch:
            offset += 1
            row = None if label is None else {"id": key, "label": label}
            out.append(TimestampedValue(UpsertCommand(key, row, offset), 1000 + 10 * b + dt))
    return out


def _consolidated(changes):
    net = collections.Counter()
    for c in changes:
        net[(c.key, json.dumps(c.value, sort_keys=True))] += c.diff
    return sorted((k, v, n) for (k, v), n in net.items() if n)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BATCHES)
def test_upsert_to_supertable_then_the_change_feed_is_the_upsert_changelog(tmp_path_factory,
                                                                           batches):
    uri = str(tmp_path_factory.mktemp("feed") / f"t{uuid.uuid4().hex}")
    commands = _commands(batches)
    by_batch = collections.defaultdict(list)
    for c in commands:
        by_batch[(c.timestamp.micros // 1_000_000 - 1000) // 10].append(c)
    for b in sorted(by_batch):
        with beam.Pipeline() as p:
            _ = (p | beam.Create(by_batch[b])
                 | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id"))
    with beam.Pipeline() as p:
        expected = p | "Cmds" >> beam.Create(commands) | Upsert("grouped")
        got = p | ReadChangesFromSupertable(uri, start_version=0, end_version="latest")
        both = [pc_ | f"{name}List" >> beam.combiners.ToList()
                | f"{name}Net" >> beam.Map(lambda changes: ("net", _consolidated(changes)))
                for name, pc_ in (("Upsert", expected), ("Feed", got))]
        pairs = both | beam.CoGroupByKey() | beam.MapTuple(lambda _, nets: nets)
        assert_that(pairs, _same_nets)


def _same_nets(pairs):
    (upsert, feed), = pairs
    assert list(upsert) == list(feed), f"Upsert: {upsert}\nfeed:   {feed}"


def test_the_example_embeds_only_the_documents_that_changed(tmp_path):
    out = subprocess.run([sys.executable, "-m", "examples.change_feed", "--dir",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == f"tables in {tmp_path}"     # kept there (--dir)
    assert out[1:] == [
        "sync of document versions 0..1: embedded 4, deleted 0; embeddings of "
        "['bread', 'cats', 'rockets', 'tides']",
        "sync of document versions 1..3: embedded 2, deleted 1; embeddings of "
        "['bread', 'cats', 'tides', 'volcanoes']",
        "sync of document versions 3..3: embedded 0, deleted 0; embeddings of "
        "['bread', 'cats', 'tides', 'volcanoes']",
        "nearest to 'sourdough starter yeast': bread"]


def test_a_bounded_read_before_an_overwrite_keeps_the_range_schema(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("a", pa.int64())]), iceberg=False)
    t.append(pa.table({"a": [7]}))
    strings = pa.schema([("a", pa.string())])
    t = Supertable.create(uri, strings, mode="overwrite", iceberg=False)
    t.append(pa.table({"a": ["x"]}, schema=strings))
    p = TestPipeline()
    out = p | ReadChangesFromSupertable(uri, start_version=0, end_version=1, columns="a")
    assert_that(out | beam.Map(lambda c: (c.value, c.diff)), equal_to([({"a": 7}, 1)]))
    p.run().wait_until_finish()
    with pytest.raises(ValueError, match="start_version must be an int >= 0"):
        ReadChangesFromSupertable(uri, start_version=None)
    with pytest.raises(ValueError, match="poll_interval must be a number of seconds > 0"):
        ReadChangesFromSupertable(uri, start_version=0, poll_interval=float("inf"))
    with pytest.raises(Exception, match="does not apply to the table's columns"):
        ReadChangesFromSupertable(uri, start_version=0, filter=pc.field("zz") > 1)


_FIRST_CHANGE = threading.Event()


def _signal_first(change):
    _FIRST_CHANGE.set()
    return change


def test_a_tailing_reader_behind_a_vacuum_fails_naming_the_version_it_needs(tmp_path):
    # The reader emits version s + 1, then waits for s + 2; meanwhile the writer commits
    # five versions and vacuums all but the latest. The reader must fail, not poll for
    # ever for a version that will never appear.
    t = _keyed(tmp_path)
    start = t.version
    t.upsert(pa.table({"id": [0], "label": ["first"]}))
    _FIRST_CHANGE.clear()

    def writer():
        assert _FIRST_CHANGE.wait(120)
        for i in range(5):
            t.upsert(pa.table({"id": [i % 2], "label": [str(i)]}))
        t.vacuum(retain_versions=1, older_than=0)

    outcome = {}

    def run():
        p = TestPipeline(options=PipelineOptions(["--streaming"]))
        _ = (p | ReadChangesFromSupertable(t.uri, start_version=start, end_version=start + 6,
                                           poll_interval=2.0)
             | beam.Map(_signal_first))
        try:
            p.run().wait_until_finish()
            outcome["result"] = "finished"
        except Exception as exc:  # noqa: BLE001 - the test reads what the pipeline raised
            outcome["result"] = str(exc)

    thread, pipeline = threading.Thread(target=writer), threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    pipeline.start()
    pipeline.join(180)
    thread.join(30)
    assert not pipeline.is_alive(), "the reader stalled on a vacuumed version"
    message = outcome["result"]
    assert f"version {start + 2}, the next this reader needs, was removed by vacuum" in message
    assert f"the oldest version still readable is {start + 6}" in message
    assert time.monotonic() - started < 120
