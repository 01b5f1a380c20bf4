"""Named consumers of the change feed: vacuum keeps what they still need, nobody else
is left waiting for a version that will never come."""

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import (
    Consumer, ConsumerNotFoundError, ReadChangesFromSupertable, Supertable, VersionNotFoundError)
from beam_supertable.cli import main as cli
from beam_supertable.format import consumers as named
from beam_supertable.format.consumers import CONSUMERS
from beam_supertable.transforms import read_changes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])


@pytest.fixture(autouse=True)
def quick_settling(monkeypatch):
    """In-process readers record what they emitted after 1 s, not the default 10 s
    (the real processes below keep the default)."""
    monkeypatch.setattr(read_changes, "SETTLE_S", 1.0)


def _keyed(tmp_path, name="t", **kwargs):
    t = Supertable.create(str(tmp_path / name), SCHEMA, primary_key="id", iceberg=False,
                          **kwargs)
    t.upsert(pa.table({"id": list(range(10)), "label": ["v0"] * 10}))
    return t


def _upsert(t, i):
    t.upsert(pa.table({"id": [i % 10, (i + 3) % 10], "label": [f"v{i}"] * 2}))


def _listed_versions(t):
    return t._manifest._listed_versions()


# -- a tailing pipeline behind a scheduled vacuum --------------------------------------
class _Collect(beam.DoFn):
    def __init__(self, path):
        self._path = path

    def process(self, change):
        with open(self._path, "a", encoding="utf-8") as out:
            out.write(json.dumps([change.key, change.value, change.diff]) + "\n")


@pytest.mark.parametrize("consumer", [None, "mirror"])
def test_a_tailing_reader_behind_a_vacuum_fails_fast_unless_it_is_a_named_consumer(
        tmp_path, consumer):
    # The writer commits 12 upserts of one key; after the sixth it vacuums everything
    # but the latest version, as a writer's vacuum_every does on its own schedule.
    t = _keyed(tmp_path)
    start = t.version
    out = tmp_path / "changes.jsonl"

    def writer():
        time.sleep(2)
        for i in range(12):
            t.upsert(pa.table({"id": [i % 10], "label": [f"v{i + 1}"]}))
            if i == 0:
                # The reader is behind from here on: it took the first version and
                # sleeps its poll interval while five more land and the vacuum runs.
                deadline = time.monotonic() + 60
                while not out.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.3)
                continue
            if i == 5:
                t.vacuum(retain_versions=1, older_than=datetime.timedelta(0))
            if i >= 5:
                time.sleep(0.2)

    outcome = {}

    def run():
        p = TestPipeline(options=PipelineOptions(["--streaming"]))
        _ = (p | ReadChangesFromSupertable(t.uri, start_version=start, end_version=start + 12,
                                           poll_interval=3.0, consumer=consumer)
             | beam.ParDo(_Collect(str(out))))
        try:
            p.run().wait_until_finish()
            outcome["result"] = "finished"
        except Exception as exc:  # noqa: BLE001 - the test reads what the pipeline raised
            outcome["result"] = str(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=writer), threading.Thread(target=run, daemon=True)]
    for th in threads:
        th.start()
    threads[1].join(120)
    threads[0].join(30)
    assert not threads[1].is_alive(), "the reader stalled"
    assert time.monotonic() - started < 60
    if consumer is None:
        assert "the next this reader needs, was removed by vacuum" in outcome["result"]
        assert "the oldest version still readable is" in outcome["result"]
        return
    assert outcome["result"] == "finished"
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == 24   # a retraction and an insertion a version
    assert got == [c for i in range(12) for c in (
        [i % 10, {"id": i % 10, "label": f"v{i // 10 * 10}" if i < 10 else f"v{i - 9}"}, -1],
        [i % 10, {"id": i % 10, "label": f"v{i + 1}"}, 1])]
    (c,) = t.consumers()
    assert (c.name, c.version, c.expired) == ("mirror", start + 12, False)


def test_a_restarted_named_reader_resumes_where_it_recorded(tmp_path):
    t = _keyed(tmp_path)
    start = t.version
    for i in range(3):
        _upsert(t, i)

    runs = iter(range(10))

    def run(end):
        out = tmp_path / f"run{next(runs)}.jsonl"
        with beam.Pipeline() as p:
            _ = (p | ReadChangesFromSupertable(t.uri, start_version=start, end_version=end,
                                               consumer="job")
                 | beam.ParDo(_Collect(str(out))))
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() \
            else []

    first = run(start + 3)
    assert len(first) == 12 and t.consumers()[0].version == start + 3
    for i in range(3, 5):
        _upsert(t, i)
    t.vacuum(retain_versions=1, older_than=0)   # the consumer holds start + 3 on
    assert _listed_versions(t) == [start + 3, start + 4, start + 5]
    second = run(start + 5)   # start_version is ignored now: it resumes after start + 3
    assert sorted(c for c in second if c[2] > 0) == sorted(
        [k, {"id": k, "label": f"v{i}"}, 1] for i in (3, 4) for k in (i % 10, (i + 3) % 10))
    assert t.consumers()[0].version == start + 5
    assert run(start + 5) == []   # nothing left: no read, no duplicate


def test_a_reader_given_only_a_consumer_name_needs_one_recorded(tmp_path):
    t = _keyed(tmp_path)
    with pytest.raises(ValueError, match="consumer 'new' has no recorded position yet"):
        ReadChangesFromSupertable(t.uri, consumer="new")
    with pytest.raises(ValueError, match="start_version must be an int >= 0"):
        ReadChangesFromSupertable(t.uri)
    for bad in ("", "-x", "a/b", "a b", "x" * 129, 7):
        with pytest.raises(ValueError, match="consumer name must be"):
            ReadChangesFromSupertable(t.uri, start_version=0, consumer=bad)
    assert t.consumers() == []   # nothing registered by a refused reader


# -- the Python face -------------------------------------------------------------------
def test_changes_with_a_consumer_reads_in_batches_and_advances(tmp_path):
    t = _keyed(tmp_path)
    start = t.version
    _upsert(t, 1)
    _upsert(t, 2)
    first = t.changes(start, consumer="batch")
    assert first.column("_version").to_pylist() == [start + 1] * 4 + [start + 2] * 4
    assert [(c.name, c.version) for c in t.consumers()] == [("batch", start + 2)]
    assert t.changes(start, consumer="batch").num_rows == 0   # the recorded version wins
    _upsert(t, 3)
    assert set(t.changes(consumer="batch").column("_version").to_pylist()) == {start + 3}
    assert t.consumers()[0].version == start + 3
    _upsert(t, 4)
    _upsert(t, 5)
    assert set(t.changes(consumer="batch", end_version=start + 4)
               .column("_version").to_pylist()) == {start + 4}
    assert t.consumers()[0].version == start + 4
    # An end before the consumer's version reads nothing and does not move it back.
    assert t.changes(consumer="batch", end_version=start + 1).num_rows == 0
    assert t.consumers()[0].version == start + 4


def test_a_refused_first_read_registers_no_consumer(tmp_path):
    t = _keyed(tmp_path)
    with pytest.raises(VersionNotFoundError):
        t.changes(t.version + 5, consumer="c")
    with pytest.raises(ValueError, match="start_version"):
        t.changes(t.version, 0, consumer="c")
    _upsert(t, 1)
    _upsert(t, 2)
    t.vacuum(retain_versions=1, older_than=0)
    with pytest.raises(VersionNotFoundError, match="removed by vacuum"):
        t.changes(1, consumer="c")
    with pytest.raises(Exception, match="nope"):
        t.changes(t.version, consumer="c", columns=["nope"])
    with pytest.raises(Exception):
        t.changes(t.version, consumer="c", filter=pc.field("nope") > 1)
    assert t.consumers() == []
    assert not t.store.list(CONSUMERS)
    t.changes(t.version, consumer="c")
    for bad in (-1, True, "3", 2.5):
        with pytest.raises(ValueError, match="end_version"):
            t.changes(consumer="c", end_version=bad)


def test_a_poller_of_a_quiet_table_stays_alive(tmp_path):
    t = _keyed(tmp_path)
    t.changes(t.version, consumer="poller")
    clock = t._manifest.clock
    t._manifest.clock = lambda: clock() + 3 * 86400
    assert t.changes(consumer="poller").num_rows == 0   # nothing new, but it polled
    t._manifest.clock = lambda: clock() + 8 * 86400
    (c,) = t.consumers()
    assert not c.expired and c.age < datetime.timedelta(days=6)


def test_a_named_pipeline_asked_to_end_before_its_record_reads_nothing_and_keeps_it(
        tmp_path):
    t = _keyed(tmp_path)
    start = t.version
    for i in range(4):
        _upsert(t, i)
    t.changes(start, consumer="job")                      # at start + 4
    t.vacuum(retain_versions=1, older_than=0)             # start .. start + 3 are gone
    out = tmp_path / "behind.jsonl"
    with beam.Pipeline() as p:
        _ = (p | ReadChangesFromSupertable(t.uri, end_version=start + 1, consumer="job")
             | beam.ParDo(_Collect(str(out))))
    assert not out.exists()
    assert t.consumers()[0].version == start + 4


# -- what vacuum keeps -----------------------------------------------------------------
def test_vacuum_keeps_every_version_a_live_consumer_needs_and_reports_it(tmp_path):
    t = _keyed(tmp_path)
    start = t.version
    t.changes(start, consumer="slow")
    for i in range(6):
        _upsert(t, i)
    t.changes(start + 2, consumer="fast")
    t.changes(consumer="fast")   # at the latest
    plan = t._manifest.plan_vacuum(retain_versions=1, older_than=0)
    report = t.vacuum(retain_versions=1, older_than=0)
    assert report.removed_versions == tuple(range(0, start))
    assert report.retained_versions == tuple(range(start, start + 7))
    assert report.held_versions == tuple(range(start, start + 6))
    assert report.held_bytes == plan.held_bytes > 0
    assert [(c.name, c.version) for c in report.consumers] == [("fast", start + 6),
                                                               ("slow", start)]
    # Every held version still reads its changes.
    assert t.changes(start, consumer="slow").num_rows == 24
    again = t.vacuum(retain_versions=1, older_than=0)
    assert again.removed_versions == tuple(range(start, start + 6))
    assert again.held_versions == () and again.held_bytes == 0


def test_an_expired_consumer_stops_holding_versions_and_fails_loudly_when_it_returns(tmp_path):
    t = _keyed(tmp_path, consumer_expiry=datetime.timedelta(hours=1))
    assert t.consumer_expiry == datetime.timedelta(hours=1)
    start = t.version
    t.changes(start, consumer="gone")
    for i in range(3):
        _upsert(t, i)
    manifest = t._manifest
    real = manifest.clock
    manifest.clock = lambda: real() + 3601
    try:
        (c,) = t.consumers()
        assert c.expired and c.age >= datetime.timedelta(hours=1)
        report = t.vacuum(retain_versions=1, older_than=0)
    finally:
        manifest.clock = real
    assert report.removed_versions == tuple(range(0, start + 3))
    assert report.consumers[0].expired and report.held_versions == ()
    with pytest.raises(VersionNotFoundError, match="consumer 'gone' is at version"):
        t.changes(consumer="gone")
    with pytest.raises(VersionNotFoundError, match="drop_consumer"):
        ReadChangesFromSupertable(t.uri, consumer="gone")
    t.drop_consumer("gone")
    assert t.changes(t.version, consumer="gone").num_rows == 0   # a new consumer again


def test_set_consumer_expiry_is_one_commit_and_refuses_nonsense(tmp_path):
    t = _keyed(tmp_path)
    assert t.consumer_expiry == datetime.timedelta(days=7)
    v = t.version
    assert t.set_consumer_expiry(120) == v + 1
    assert t.set_consumer_expiry(datetime.timedelta(minutes=2)) == v + 1
    assert Supertable.open(t.uri).consumer_expiry == datetime.timedelta(minutes=2)
    for bad in (0, -1, float("nan"), float("inf"), "7d", True, 10 ** 20, 1e308, 10 ** 400,
                datetime.timedelta.max):
        with pytest.raises(ValueError, match="consumer_expiry must be"):
            t.set_consumer_expiry(bad)
    assert t.version == v + 1 and t.consumer_expiry == datetime.timedelta(minutes=2)


def test_a_dropped_consumer_is_gone_and_an_unknown_one_is_refused(tmp_path):
    t = _keyed(tmp_path)
    t.changes(t.version, consumer="a")
    t.changes(t.version, consumer="b")
    assert [c.name for c in t.consumers()] == ["a", "b"]
    assert isinstance(t.consumers()[0], Consumer)
    t.drop_consumer("a")
    assert [c.name for c in t.consumers()] == ["b"]
    assert [i.path for i in t.store.list(CONSUMERS)] == [f"{CONSUMERS}/b.json"]
    with pytest.raises(ConsumerNotFoundError, match="no consumer named 'a'"):
        t.drop_consumer("a")
    with pytest.raises(LookupError):
        t.drop_consumer("a")
    with pytest.raises(ValueError, match="consumer name must be"):
        t.drop_consumer("../b")


def test_consumers_never_block_optimize(tmp_path):
    t = _keyed(tmp_path)
    start = t.version
    t.changes(start, consumer="lagging")
    for i in range(8):
        _upsert(t, i)
    before = t.to_arrow().sort_by("id")
    assert t.optimize() is not None
    assert t.to_arrow().sort_by("id").equals(before)
    changes = t.changes(consumer="lagging")
    assert changes.filter(pc.field("_version") == t.version).num_rows == 0   # optimize: none
    assert t.consumers()[0].version == t.version


def test_a_corrupt_consumer_record_is_named_holds_nothing_and_can_be_dropped(
        tmp_path, caplog):
    t = _keyed(tmp_path)
    _upsert(t, 1)
    t.store.put(f"{CONSUMERS}/broken.json", b"{not json")
    with pytest.raises(Exception, match="broken.json.*drop-consumer"):
        t.consumers()
    # No reader can resume from it: vacuum says so and goes on.
    assert t.vacuum(retain_versions=1, older_than=0).removed_versions
    assert "broken.json" in caplog.text
    t.drop_consumer("broken")
    assert t.consumers() == []


def test_a_consumer_is_listed_by_its_object_name(tmp_path):
    t = _keyed(tmp_path)
    t.changes(t.version, consumer="good")
    t.store.put(f"{CONSUMERS}/copy.json", t.store.get(f"{CONSUMERS}/good.json"))
    assert [c.name for c in t.consumers()] == ["copy", "good"]
    t.drop_consumer("copy")
    assert [c.name for c in t.consumers()] == ["good"]
    # Only what drop_consumer could remove is a consumer.
    for stray in ("sub/nested.json", ".hidden.json", "bad name.json", "good.txt"):
        t.store.put(f"{CONSUMERS}/{stray}", t.store.get(f"{CONSUMERS}/good.json"))
    assert [c.name for c in t.consumers()] == ["good"]


def test_inspect_and_the_cli_list_consumers(tmp_path, capsys):
    t = _keyed(tmp_path)
    start = t.version
    t.changes(start, consumer="mirror")
    _upsert(t, 1)
    _upsert(t, 2)
    assert cli(["inspect", "--table", t.uri, "--json", "--retain-versions", "1",
                "--older-than", "0s"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in report["consumers"]["list"]] == ["mirror"]
    assert report["consumers"]["held"]["versions"] == 2
    assert report["storage"]["by_kind"]["consumers"]["objects"] == 1
    assert cli(["consumers", "--table", t.uri]) == 0
    text = capsys.readouterr().out
    assert f"mirror: version {start}" in text and f"holds versions {start}..{start + 2}" in text
    assert cli(["consumers", "--table", t.uri, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["consumers"][0]["version"] == start and doc["consumer_expiry_s"] == 7 * 86400
    assert cli(["vacuum", "--table", t.uri, "--retain-versions", "1", "--older-than", "0s",
                "--json"]) == 0
    vac = json.loads(capsys.readouterr().out)
    assert vac["consumers"][0]["name"] == "mirror" and vac["held_versions"] == [start,
                                                                                start + 1]
    assert cli(["drop-consumer", "--table", t.uri, "mirror"]) == 0
    assert cli(["drop-consumer", "--table", t.uri, "--name", "mirror"]) == 1
    assert "no consumer named 'mirror'" in capsys.readouterr().err
    assert t.consumers() == []
    for usage in (["--table", t.uri], ["--table", t.uri, "--name", ""],
                  ["--table", t.uri, "--name", "../x"], ["--table", t.uri, "--name", "a", "b"]):
        with pytest.raises(SystemExit) as exit_:
            cli(["drop-consumer", *usage])
        assert exit_.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    t.vacuum(retain_versions=1, older_than=0)
    gone = min(_listed_versions(t)) - 1
    named.record(t.store, "ghost", gone, t._manifest.clock())   # a version vacuumed since
    assert cli(["consumers", "--table", t.uri]) == 0
    assert "ghost: version" in (text := capsys.readouterr().out) and "holds nothing" in text


# -- a model of what vacuum keeps --------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.integers(2, 7), st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=3),
       st.integers(1, 3))
def test_vacuum_keeps_what_the_model_says(tmp_path_factory, commits, consumers, retain):
    # Model: the newest ``retain`` versions, and every version from the oldest live
    # consumer's on, when that version is still there.
    t = Supertable.create(str(tmp_path_factory.mktemp("m") / "t"), SCHEMA, primary_key="id",
                          iceberg=False)
    for i in range(commits):
        _upsert(t, i)
    real = t._manifest.clock
    for n, (version, expired) in enumerate(consumers):
        version = min(version, t.version)
        t._manifest.clock = (lambda: real() - 8 * 86400) if expired else real
        t.changes(version, version, consumer=f"c{n}")
    t._manifest.clock = real
    listed = _listed_versions(t)
    keep = set(listed[-retain:])
    live = [v for (v, expired) in ((min(v, t.version), e) for v, e in consumers) if not expired]
    if live:
        keep |= {v for v in listed if v >= min(live)}
    report = t.vacuum(retain_versions=retain, older_than=0)
    assert set(report.retained_versions) == keep
    assert _listed_versions(t) == sorted(keep)
    for v in sorted(keep)[:-1]:
        t.changes(v)   # every kept version still reads


# -- real processes: a mirror killed and restarted while writers and a vacuum race --------
def _spawn(module, *args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", f"tests.beam_supertable.{module}", *args],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), **kwargs)


@pytest.mark.slow
def test_a_named_mirror_killed_and_restarted_under_vacuum_ends_equal_to_its_source(tmp_path):
    source = Supertable.create(str(tmp_path / "source"), SCHEMA, primary_key="id",
                               iceberg=False)
    source.upsert(pa.table({"id": list(range(12)), "label": ["v0"] * 12}))
    start = source.version
    mirror = str(tmp_path / "mirror")
    stop = tmp_path / "stop-vacuum"

    logs = []

    def mirror_proc():
        logs.append(tmp_path / f"mirror{len(logs)}.log")
        with open(logs[-1], "w") as log:
            return _spawn("mirror_proc", source.uri, mirror, "mirror", str(start), stderr=log)

    def last_log():
        return logs[-1].read_text()[-3000:]

    def consumer_version():
        held = [c.version for c in Supertable.open(source.uri).consumers()]
        return held[0] if held else -1

    reader = mirror_proc()
    registered = time.monotonic() + 120   # a vacuum before it registers would take its start
    while consumer_version() < start and time.monotonic() < registered:
        time.sleep(0.2)
    assert consumer_version() == start, last_log()
    writers = [_spawn("keyed_proc", source.uri, "null", name, "30", "12", "1",
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for name in ("w1", "w2")]
    vacuum = _spawn("writer_proc", "vacuum", source.uri, "null", str(stop), "2", "1",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for w in writers:
            assert w.stdout.readline().strip() == "READY"
        for w in writers:
            w.stdin.write("go\n")
            w.stdin.flush()
        kills = 0
        deadline = time.monotonic() + 300
        while kills < 2 and time.monotonic() < deadline:
            if consumer_version() >= start + 5 * (kills + 1):
                reader.send_signal(signal.SIGKILL)
                reader.wait()
                kills += 1
                reader = mirror_proc()
            time.sleep(0.3)
        assert kills == 2, f"the mirror made no progress to kill it in: {last_log()}"
        for w in writers:
            w.stdout.read()
            assert w.wait(timeout=240) == 0
        latest = Supertable.open(source.uri).version
        deadline = time.monotonic() + 120   # it settles, then records
        while consumer_version() < latest and time.monotonic() < deadline:
            time.sleep(0.3)
        assert consumer_version() == latest, last_log()
        stop.touch()
        out, err = vacuum.communicate(timeout=120)
        assert vacuum.returncode == 0, err[-3000:]
        removed = int(out.split()[1])
        assert removed > 0, "the vacuum removed nothing: it never raced the reader"

        def live(uri):
            return Supertable.open(uri).to_arrow(columns=["id", "label"]).sort_by("id")
        want = live(source.uri)
        deadline = time.monotonic() + 120
        while not live(mirror).equals(want) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert live(mirror).to_pylist() == want.to_pylist()
    finally:
        stop.touch()
        for proc in [reader, vacuum, *writers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
