"""UpsertToSupertable: the upsert loop closed on a keyed supertable."""

import json
import os
import subprocess
import sys
import uuid

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import SchemaMismatchError, Supertable, UpsertToSupertable
from beam_supertable.testing import assert_table_rows, upsert_stream
from beam_upsert import UpsertCommand

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
D = 4
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("emb", pa.list_(pa.float32(), D))])
S = 1_000_000  # µs per second


def _row(i, name, v=None):
    return {"id": i, "name": name, "emb": [float(v if v is not None else i % 7), 1.0, 0.0, 0.5]}


def _commands(items):
    """``(key, row|None, offset, seconds)`` -> timestamped commands."""
    return [TimestampedValue(UpsertCommand(k, r, o), t) for k, r, o, t in items]


def _run(uri, items, *, options=None, expect_commits=None, expect_invalid=None, **kwargs):
    """Runs one batch; returns the pipeline result (for counters)."""
    p = TestPipeline()
    result = (p | beam.Create(_commands(items))
              | UpsertToSupertable(uri, storage_options=options, **kwargs).with_invalid_output())
    if expect_commits is not None:
        assert_that(result.commits | beam.Map(lambda c: (c.rows, c.deduplicated)),
                    equal_to(expect_commits), label="Commits")
    if expect_invalid is not None:
        assert_that(result.invalid | beam.Map(lambda i: (i.element[0], i.reason)),
                    equal_to(expect_invalid), label="Invalid")
    out = p.run()
    out.wait_until_finish()
    return out


def _counter(result, name):
    found = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return sum(c.committed if c.committed is not None else c.attempted for c in found)


def _table(uri, options=None):
    t = Supertable.open(uri, storage_options=options)
    rows = t.to_arrow(columns=[c for c in t.user_schema.names if c != "emb"]).to_pylist()
    key = t.primary_key
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


BATCH = [
    (1, _row(1, "a"), 1, 10),
    (2, _row(2, "b"), 2, 10),
    (2, _row(2, "b2"), 3, 11),           # a later time replaces
    (3, _row(3, "c"), 4, 10),
    (3, None, 5, 12),                    # deleted again in the same batch
    (4, _row(4, "d"), 7, 10),
    (4, _row(4, "d-older"), 6, 10),      # same time, smaller offset: loses
]


def test_bounded_batch_is_one_commit_and_rerun_changes_nothing(table_location):
    uri, options = table_location
    create = dict(schema=SCHEMA, primary_key="id", vector_column="emb")
    _run(uri, BATCH, options=options, expect_commits=[(3, False)], **create)
    t = Supertable.open(uri, storage_options=options)
    assert t.version == 1   # create + ONE commit
    assert t.frontier == 12 * S + 1
    assert _table(uri, options) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b2"},
                                    {"id": 4, "name": "d"}]
    assert t.search(vector=[1.0, 1.0, 0.0, 0.5], k=1, columns=["id"])["id"].to_pylist() == [1]
    # A rerun of the same batch finds every command below the frontier.
    again = _run(uri, BATCH, options=options, expect_commits=[], **create)
    assert Supertable.open(uri, storage_options=options).version == 1
    assert _counter(again, "dropped_before_resume") == len(BATCH)
    assert _table(uri, options) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b2"},
                                    {"id": 4, "name": "d"}]


def test_later_batch_applies_on_top_and_older_commands_are_dropped(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, primary_key="id", vector_column="emb")
    _run(uri, BATCH)
    later = [
        (1, _row(1, "a2"), 8, 20),           # update
        (2, None, 9, 20),                    # delete
        (5, _row(5, "e"), 10, 21),           # insert
        (4, _row(4, "stale"), 11, 11),       # below the frontier (12 s + 1 µs): dropped
        (4, _row(4, "d"), 12, 22),           # the value it has: no change
    ]
    result = _run(uri, later, expect_commits=[(2, False)])
    t = Supertable.open(uri)
    assert t.version == 2
    assert t.frontier == 22 * S + 1
    assert _table(uri) == [{"id": 1, "name": "a2"}, {"id": 4, "name": "d"},
                           {"id": 5, "name": "e"}]
    assert t.count_rows() == 3
    assert (_counter(result, "inserts"), _counter(result, "updates"),
            _counter(result, "deletes"), _counter(result, "dropped_before_resume")) == (1, 1, 1, 1)
    # Older versions still read their own rows.
    assert [r["name"] for r in t.checkout(1).to_arrow(columns=["name"]).to_pylist()
            if r["name"].startswith("b")] == ["b2"]


def test_invalid_commands_go_to_the_dead_letter_output(tmp_path):
    uri = str(tmp_path / "t")
    items = [
        (1, _row(1, "ok"), 1, 10),
        (2, _row(3, "wrong key"), 2, 10),                 # key disagrees with the row
        (4, {"id": 4, "name": "x", "emb": [1.0]}, 3, 10),  # wrong vector length
        (5, {"id": 5, "name": "x", "nope": 1}, 4, 10),    # unknown column
        (6, "not a row", 5, 10),
        (None, None, 6, 10),                               # no key
    ]
    p = TestPipeline()
    result = (p | beam.Create(_commands(items) + [TimestampedValue("junk", 10)])
              | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id",
                                   vector_column="emb").with_invalid_output())
    reasons = result.invalid | beam.Map(lambda i: (repr(i.element)[:20], i.reason))

    def check(got):
        text = " | ".join(r for _, r in got)
        assert len(got) == 6, got
        for needle in ("key 2: the row's key column(s) ['id'] hold 3, not the command's key",
                       "key 4: column 'emb' expects 4 float32 values, got 1",
                       "['nope'] are not in the table schema", "must be a dict",
                       "key is None", "3-tuple"):
            assert needle in text, (needle, text)

    assert_that(reasons, check)
    p.run().wait_until_finish()
    assert _table(uri) == [{"id": 1, "name": "ok"}]


def test_each_kind_of_bad_row_is_an_invalid_naming_key_column_and_type(tmp_path):
    uri = str(tmp_path / "t")
    big = 2**70
    items = [
        (1, _row(1, "ok"), 1, 10),
        (2, {"id": 2, "name": 5, "emb": [1.0, 1.0, 0.0, 0.0]}, 2, 10),
        (3, {"id": 3, "name": "short", "emb": [1.0, 2.0]}, 3, 10),
        (4, {"id": 4, "name": "nan", "emb": [1.0, float("nan"), 0.0, 0.0]}, 4, 10),
        (5, dict(_row(5, "extra"), colour="red"), 5, 10),
        (6, {"id": 6, "name": "no vector"}, 6, 10),
        (7, _row(8, "other key"), 7, 10),
        ("x", None, 8, 10),
        (big, None, 9, 10),
    ]
    p = TestPipeline()
    result = (p | beam.Create(_commands(items))
              | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id",
                                   vector_column="emb").with_invalid_output())
    assert_that(result.invalid | beam.Map(lambda i: (type(i).__name__, i.reason)), equal_to([
        ("Invalid", "key 2: column 'name' expects string, got int 5"),
        ("Invalid", "key 3: column 'emb' expects 4 float32 values, got 2"),
        ("Invalid", "key 4: column 'emb' expects 4 finite float32 values, got NaN at position 1"),
        ("Invalid", "key 5: column(s) ['colour'] are not in the table schema "
                    "['id', 'name', 'emb']"),
        ("Invalid", "key 6: column 'emb' expects 4 float32 values, but the row lacks it "
                    "(every row needs a vector)"),
        ("Invalid", "key 7: the row's key column(s) ['id'] hold 8, not the command's key"),
        ("Invalid", "key 'x': key column 'id' expects int64, got str 'x'"),
        ("Invalid", f"key {big}: key column 'id' expects int64, got int {big}, outside "
                    f"int64's range"),
    ]))
    p.run().wait_until_finish()
    assert _table(uri) == [{"id": 1, "name": "ok"}]


def test_composite_key_and_delete(tmp_path):
    uri = str(tmp_path / "t")
    schema = pa.schema([("tenant", pa.string()), ("n", pa.int32()), ("v", pa.float64())])
    create = dict(schema=schema, primary_key=["tenant", "n"])

    def row(t, n, v):
        return {"tenant": t, "n": n, "v": v}

    _run(uri, [(("a", 1), row("a", 1, 1.0), 1, 1), (("a", 2), row("a", 2, 2.0), 2, 1),
               (("b", 1), row("b", 1, 3.0), 3, 1),
               (("b", 2), row("a", 2, 9.0), 4, 1)],        # key disagrees: invalid
         expect_invalid=[(("b", 2), "key ('b', 2): the row's key column(s) ['tenant', 'n'] "
                                    "hold ('a', 2), not the command's key")],
         **create)
    _run(uri, [(("a", 1), None, 5, 2), (("b", 1), row("b", 1, 4.0), 6, 2),
               ("a", row("a", 3, 1.0), 7, 2)],             # not a tuple key
         expect_invalid=[("a", "key 'a' must be a tuple of 2 values, one per key column "
                               "['tenant', 'n']")], **create)
    t = Supertable.open(uri)
    assert t.version == 2
    assert _table(uri) == [row("a", 2, 2.0), row("b", 1, 4.0)]
    assert t.count_rows(pc.field("tenant") == "a") == 1


def test_construction_validates_and_writes_nothing(tmp_path):
    uri = str(tmp_path / "t")
    with pytest.raises(ValueError, match="flavor"):
        UpsertToSupertable(uri, flavor="fast")
    with pytest.raises(ValueError, match="metric"):
        UpsertToSupertable(uri, metric="euclid")
    with pytest.raises(SchemaMismatchError, match="primary key column 'nope'"):
        UpsertToSupertable(uri, schema=SCHEMA, primary_key="nope")
    UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", vector_column="emb")
    assert not os.path.exists(uri)


def test_a_keyless_table_fails_the_pipeline_clearly(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA)
    with pytest.raises(Exception, match="no primary key"):
        _run(uri, BATCH)
    assert Supertable.open(uri).version == 0


def test_stateful_flavor_on_bounded_input_matches_grouped(tmp_path):
    tables = []
    for flavor in ("grouped", "stateful"):
        uri = str(tmp_path / flavor)
        _run(uri, BATCH, schema=SCHEMA, primary_key="id", flavor=flavor)
        t = Supertable.open(uri)
        assert t.version == 1 and t.frontier == 12 * S + 1
        tables.append(_table(uri))
    assert tables[0] == tables[1]


# -- unbounded input ------------------------------------------------------------------
STREAM = [(k, _row(k, f"v{k}-{t}") if (k + t) % 5 else None, t * 10 + k, t)
          for t in range(1, 7) for k in range(8)]


def _stream_run(uri, items, *, until=None):
    """Streams ``items`` (ascending times), advancing the watermark after each time.

    With ``until``, only items before that time are sent and the job stops
    (a crash: the rest never arrives).
    """
    stream = upsert_stream()
    for t in sorted({i[3] for i in items}):
        if until is not None and t >= until:
            break
        stream.commands([i for i in items if i[3] == t]).advance_watermark(to=t + 1)
    stream = stream.build()
    p = TestPipeline(options=PipelineOptions(streaming=True))
    commits = (p | stream
               | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id"))
    assert_that(commits | beam.Map(lambda c: c.deduplicated), lambda got: all(not d for d in got))
    p.run().wait_until_finish()


def _model(items, frontier=None):
    """The reference: per key, the command with the greatest (time, offset)."""
    last = {}
    for k, r, o, t in items:
        if frontier is not None and t * S < frontier:
            continue
        if k not in last or (t, o) > last[k][0]:
            last[k] = ((t, o), r)
    return sorted(({"id": r["id"], "name": r["name"]} for _, r in last.values() if r),
                  key=lambda r: r["id"])


def test_unbounded_commits_per_firing_and_restart_resumes_from_the_frontier(tmp_path):
    single = str(tmp_path / "single")
    _stream_run(single, STREAM)
    t = Supertable.open(single)
    assert_table_rows(single, _model(STREAM), columns=["id", "name"], key="id")
    assert t.version > 2                       # one commit per firing, not one in all
    assert t.frontier == 7 * S                 # the end of the last slot applied
    fronts = [t.checkout(v).frontier for v in range(1, t.version + 1)]
    assert fronts == sorted(fronts)            # only moves forward
    # A job that stops after time 3, restarted on the whole stream.
    restarted = str(tmp_path / "restarted")
    _stream_run(restarted, STREAM, until=4)
    assert Supertable.open(restarted).frontier == 4 * S
    _stream_run(restarted, STREAM)
    assert _table(restarted) == _table(single)
    assert Supertable.open(restarted).frontier == 7 * S


class _SecondWriter(beam.DoFn):
    """Between a stream's first and second firing, another writer moves the
    table's frontier far ahead (a second job on the same table)."""

    def __init__(self, uri):
        self._uri = uri

    def process(self, command, ts=beam.DoFn.TimestampParam):
        if int(ts.micros) == 2 * S and command.key == 0:
            Supertable.open(self._uri).upsert([_row(99, "other job")], frontier=100 * S)
        yield beam.window.TimestampedValue(command, ts)


def test_a_second_writer_moving_the_frontier_ahead_fails_the_stream_not_the_table(tmp_path):
    # The README's "one job per table": a firing whose frontier falls behind
    # the table's commits nothing (FrontierError), so no change lands below a
    # frontier that says it is already in.
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, primary_key="id")
    stream = TestStream()
    for t in (1, 2, 3):
        stream = stream.add_elements(_commands([i for i in STREAM if i[3] == t]))
        stream = stream.advance_watermark_to(t + 1)
    p = TestPipeline(options=PipelineOptions(streaming=True))
    _ = (p | stream.advance_watermark_to_infinity() | beam.ParDo(_SecondWriter(uri))
         | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id"))
    with pytest.raises(Exception, match="FrontierError|frontier"):
        p.run().wait_until_finish()
    t = Supertable.open(uri)
    assert t.frontier == 100 * S
    assert all(v.frontier is None or v.frontier <= 2 * S or v.frontier == 100 * S
               for v in (t.checkout(n) for n in range(t.version + 1)))
    assert all(r["id"] == 99 or r["name"].endswith("-1") for r in _table(uri))


# -- a reference model ------------------------------------------------------------------
_cmd = st.tuples(st.integers(0, 6), st.booleans(), st.integers(0, 4))   # key, delete?, time


_MODEL = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


# Each example runs two Beam pipelines (about 6 s here): the full run is slow,
# a few examples of the same property keep it in the default run.
@pytest.mark.slow
@settings(max_examples=15, **_MODEL)
@given(first=st.lists(_cmd, max_size=12), second=st.lists(_cmd, max_size=12))
def test_table_equals_the_last_command_per_key_above_the_frontier(first, second):
    _check_against_the_model(first, second)


@settings(max_examples=3, **_MODEL)
@given(first=st.lists(_cmd, max_size=12), second=st.lists(_cmd, max_size=12))
def test_table_equals_the_model_on_a_few_command_lists(first, second):
    _check_against_the_model(first, second)


def _check_against_the_model(first, second):
    uri = f"memory://upsert-model/{uuid.uuid4().hex}"
    offsets = iter(range(10_000))

    def items(raw, shift):
        return [(k, None if gone else _row(k, f"{k}@{t + shift}"), next(offsets), t + shift)
                for k, gone, t in raw]

    a, b = items(first, 10), items(second, 12)
    _run(uri, a, schema=SCHEMA, primary_key="id")
    t = Supertable.open(uri)
    frontier = t.frontier
    assert _table(uri) == _model(a)
    _run(uri, b, schema=SCHEMA, primary_key="id")
    merged = a + [i for i in b if frontier is None or i[3] * S >= frontier]
    assert _table(uri) == _model(merged)
    t = Supertable.open(uri)
    live = t.to_arrow(columns=["id"])["id"].to_pylist()
    assert len(live) == len(set(live))   # at most one live row per key


# -- crashes, with real processes ------------------------------------------------------------
CRASH_BATCH = [(k, _row(k, f"n{k}"), k, 10 + k % 3) for k in range(40)] + \
              [(k, None, 100 + k, 20) for k in range(0, 40, 7)]


def _proc(uri, crash):
    return subprocess.run(
        [sys.executable, "-m", "tests.beam_supertable.upsert_proc", uri, crash],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.slow    # three real processes, each a Beam job: about 15 s a case
@pytest.mark.parametrize("crash", ["before", "after"])
def test_crash_around_the_commit_then_rerun_equals_one_clean_run(tmp_path, crash):
    clean = str(tmp_path / "clean")
    done = _proc(clean, "none")
    assert done.returncode == 0, done.stderr[-3000:]
    uri = str(tmp_path / "crashed")
    died = _proc(uri, crash)
    assert died.returncode == 17, died.stderr[-3000:]
    t = Supertable.open(uri)
    assert t.version == (0 if crash == "before" else 1)
    again = _proc(uri, "none")
    assert again.returncode == 0, again.stderr[-3000:]
    t, c = Supertable.open(uri), Supertable.open(clean)
    assert t.version == c.version == 1
    assert t.frontier == c.frontier
    assert _table(uri) == _table(clean) == _model(CRASH_BATCH)
    assert json.dumps(t.history()[-1]["operation"]) == json.dumps("upsert")


def test_refused_rows_below_the_frontier_are_dropped_and_above_it_invalid(tmp_path):
    # Validation runs before the pinned frontier is known (it fuses with the
    # step making the commands); a refused row is settled against it after.
    uri = str(tmp_path / "t")
    _run(uri, [(1, _row(1, "a"), 1, 10)], schema=SCHEMA, primary_key="id", vector_column="emb")
    result = _run(uri, [(2, _row(3, "below, wrong key"), 2, 5),
                        (4, _row(5, "above, wrong key"), 3, 20),
                        (6, _row(6, "f"), 4, 20)],
                  expect_commits=[(1, False)],
                  expect_invalid=[(4, "key 4: the row's key column(s) ['id'] hold 5, not the "
                                      "command's key")])
    assert (_counter(result, "dropped_before_resume"), _counter(result, "invalid")) == (1, 1)
    assert _table(uri) == [{"id": 1, "name": "a"}, {"id": 6, "name": "f"}]


def _ancestors_until_shuffle(proto, start):
    """Transforms the commands pass from PCollection ``start`` up to a GroupByKey.

    Refused commands (the ``invalid`` and ``unsettled`` outputs) are not followed.
    """
    consumers = {}
    for tid, t in proto.components.transforms.items():
        if t.subtransforms:
            continue
        for tag, coll in t.inputs.items():
            consumers.setdefault(coll, []).append((tid, tag))
    seen, todo, out = set(), [start], []
    while todo:
        for tid, tag in consumers.get(todo.pop(), []):
            t = proto.components.transforms[tid]
            if tid in seen:
                continue
            seen.add(tid)
            if t.spec.urn == "beam:transform:group_by_key:v1":
                continue
            out.append((t, tag))
            todo.extend(pc for name, pc in t.outputs.items()
                        if name not in ("invalid", "unsettled"))
    return out


def test_commands_reach_the_first_shuffle_without_a_side_input_step(tmp_path):
    # A step with a side input starts a new stage on a portable runner
    # (Flink): every command would cross between the runner and the SDK
    # worker once more. Up to the first shuffle the steps take none, and
    # the grouped flavor shuffles one list per key shard, not per command.
    from apache_beam.portability.api import beam_runner_api_pb2

    uri = str(tmp_path / "t")
    p = beam.Pipeline()
    commands = p | beam.Create(_commands(BATCH))
    _ = commands | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", flavor="grouped")
    proto = p.to_runner_api()
    start = next(iter(next(t for t in proto.components.transforms.values()
                           if t.unique_name == commands.producer.full_label).outputs.values()))
    steps = _ancestors_until_shuffle(proto, start)
    pardos = [t for t, _ in steps if t.spec.urn == "beam:transform:pardo:v1"]
    assert any("Validate" in t.unique_name for t in pardos)
    for t in pardos:
        payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
        assert not payload.side_inputs, f"{t.unique_name} takes a side input"


# -- the stateful flavor per state shard ---------------------------------------------------
def _stream_batches_run(uri, batches, *, state_shards):
    """``batches``: ``[(time_micros, [(key, row | None, offset), ...]), ...]`` in
    ascending time; the watermark passes each batch's time after it."""
    stream = upsert_stream()
    for at, commands in batches:
        stream.commands([(k, r, o, Timestamp(micros=at)) for k, r, o in commands])
        # (TestStream watermarks are whole milliseconds.)
        stream.advance_watermark(to=Timestamp(micros=(at // 1000 + 1) * 1000))
    p = TestPipeline(options=PipelineOptions(streaming=True))
    _ = (p | stream.build()
         | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", state_shards=state_shards))
    p.run().wait_until_finish()


_batch = st.lists(st.tuples(st.integers(0, 30), st.booleans(), st.integers(0, 3)),
                  min_size=1, max_size=10)


@settings(max_examples=6, deadline=None)
@given(raw=st.lists(_batch, min_size=1, max_size=4), shards=st.sampled_from([1, 2]))
def test_keys_sharing_a_state_shard_equal_the_reference(raw, shards):
    # Many keys on one or two state shards: a firing applies only the keys
    # with commands due, keeps every other key's value and pending commands,
    # and collapses same-time commands by offset (sent in reverse order).
    # Times fall inside a commit slot and off whole milliseconds.
    uri = f"memory://upsert-shards/{uuid.uuid4().hex}"
    offsets = iter(range(10_000, 0, -1))
    batches, items = [], []
    for i, commands in enumerate(raw):
        at = (10 + i) * S + 1_234 * i + 7
        batch = []
        for k, gone, same in commands:
            o = next(offsets) + same * 100_000   # larger `same`: later in offset order
            row = None if gone else _row(k, f"{k}@{i}/{o}")
            batch.append((k, row, o))
            items.append((k, row, o, at / S))
        batches.append((at, batch))
    _stream_batches_run(uri, batches, state_shards=shards)
    assert_table_rows(uri, _model(items), columns=["id", "name"], key="id")
    live = Supertable.open(uri).to_arrow(columns=["id"])["id"].to_pylist()
    assert len(live) == len(set(live))


def test_state_shards_is_validated_at_construction():
    with pytest.raises(ValueError, match="state_shards must be a positive int, got 0"):
        UpsertToSupertable("memory://x", state_shards=0)


# -- reruns and the frontier -------------------------------------------------------
CSCHEMA = pa.schema([("a", pa.string()), ("b", pa.int64()), ("name", pa.string())])


def _rows(uri, cols):
    t = Supertable.open(uri)
    return sorted(t.to_arrow(columns=cols).to_pylist(), key=lambda r: tuple(r[c] for c in cols))


def _ids(res):
    return res["id"].to_pylist()


TWO_LIVE_KEYS_BATCH = [  # leaves keys 1 and 2 live (EXPECT)
    (1, _row(1, "a"), 1, 10),
    (2, _row(2, "b"), 2, 10),
    (2, _row(2, "b2"), 3, 11),
    (3, _row(3, "c"), 4, 10),
    (3, None, 5, 12),
    (9, None, 6, 10),                    # delete of a key never written
]


EXPECT = [{"id": 1, "name": "a"}, {"id": 2, "name": "b2"}]


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_bounded_rerun_same_job_id_writes_nothing(tmp_path, flavor):
    uri = str(tmp_path / "t")
    create = dict(schema=SCHEMA, primary_key="id", flavor=flavor, job_id="job-1")
    _run(uri, TWO_LIVE_KEYS_BATCH, **create)
    t = Supertable.open(uri)
    v, frontier = t.version, t.frontier
    assert frontier == 12 * S + 1
    assert _rows(uri, ["id", "name"]) == EXPECT
    _run(uri, TWO_LIVE_KEYS_BATCH, expect_commits=[], **create)
    t = Supertable.open(uri)
    assert (t.version, t.frontier) == (v, frontier)
    assert _rows(uri, ["id", "name"]) == EXPECT
    assert t.count_rows() == 2


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_only_deletes_of_unknown_keys_and_commands_below_frontier(tmp_path, flavor):
    uri = str(tmp_path / "t")
    create = dict(schema=SCHEMA, primary_key="id", flavor=flavor)
    _run(uri, TWO_LIVE_KEYS_BATCH, **create)
    v = Supertable.open(uri).version
    # Below the frontier: all dropped, nothing committed.
    _run(uri, [(1, _row(1, "old"), 1, 5), (7, _row(7, "x"), 2, 12)], expect_commits=[], **create)
    assert Supertable.open(uri).version == v
    assert _rows(uri, ["id", "name"]) == EXPECT
    # Only deletes of keys the table never held, above the frontier.
    _run(uri, [(50, None, 1, 30), (51, None, 2, 31)], **create)
    t = Supertable.open(uri)
    assert _rows(uri, ["id", "name"]) == EXPECT
    assert t.frontier in (12 * S + 1, 31 * S + 1)


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_mixed_batch_below_and_above_the_frontier(tmp_path, flavor):
    uri = str(tmp_path / "t")
    create = dict(schema=SCHEMA, primary_key="id", flavor=flavor)
    _run(uri, TWO_LIVE_KEYS_BATCH, **create)
    mixed = [(1, _row(1, "stale"), 1, 11), (1, _row(1, "new"), 2, 20),
             (2, None, 3, 12), (4, _row(4, "d"), 4, 13)]
    _run(uri, mixed, expect_commits=[(2, False)], **create)
    t = Supertable.open(uri)
    assert t.frontier == 20 * S + 1
    assert _rows(uri, ["id", "name"]) == [{"id": 1, "name": "new"}, {"id": 2, "name": "b2"},
                                          {"id": 4, "name": "d"}]
    _run(uri, mixed, expect_commits=[], **create)
    assert Supertable.open(uri).version == t.version


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_commands_at_the_frontier_boundary(tmp_path, flavor):
    from apache_beam.utils.timestamp import Timestamp
    uri = str(tmp_path / "t")
    create = dict(schema=SCHEMA, primary_key="id", flavor=flavor)
    _run(uri, TWO_LIVE_KEYS_BATCH, **create)
    f = Supertable.open(uri).frontier
    items = [(1, _row(1, "just below"), 1, Timestamp(micros=f - 1)),
             (2, _row(2, "at"), 2, Timestamp(micros=f))]
    _run(uri, items, expect_commits=[(1, False)], **create)
    t = Supertable.open(uri)
    assert t.frontier == f + 1
    assert _rows(uri, ["id", "name"]) == [{"id": 1, "name": "a"}, {"id": 2, "name": "at"}]


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_commands_without_timestamps_then_rerun(tmp_path, flavor):
    """beam.Create without timestamps stamps every command at Beam's minimum time."""
    uri = str(tmp_path / "t")
    cmds = [UpsertCommand(1, _row(1, "a"), 1), UpsertCommand(2, _row(2, "b"), 2),
            UpsertCommand(2, _row(2, "b2"), 3)]
    for attempt in range(2):
        p = TestPipeline()
        _ = (p | beam.Create(cmds)
             | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", flavor=flavor))
        p.run().wait_until_finish()
        t = Supertable.open(uri)
        if attempt == 0:
            v = t.version
        assert t.version == v
        assert _rows(uri, ["id", "name"]) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b2"}]


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_composite_key_rerun_and_delete(tmp_path, flavor):
    uri = str(tmp_path / "t")
    items = [
        (("x", 1), {"a": "x", "b": 1, "name": "x1"}, 1, 10),
        (("x", 2), {"a": "x", "b": 2, "name": "x2"}, 2, 10),
        (("y", 1), {"a": "y", "b": 1, "name": "y1"}, 3, 10),
        (("x", 2), None, 4, 11),
        (("z", 9), None, 5, 11),
    ]
    create = dict(schema=CSCHEMA, primary_key=["a", "b"], flavor=flavor, job_id="c")
    _run(uri, items, **create)
    want = [{"a": "x", "b": 1, "name": "x1"}, {"a": "y", "b": 1, "name": "y1"}]
    assert _rows(uri, ["a", "b", "name"]) == want
    v = Supertable.open(uri).version
    _run(uri, items, expect_commits=[], **create)
    assert Supertable.open(uri).version == v
    assert _rows(uri, ["a", "b", "name"]) == want
    later = [(("x", 1), {"a": "x", "b": 1, "name": "x1b"}, 6, 20), (("y", 1), None, 7, 20)]
    _run(uri, later, **create)
    assert _rows(uri, ["a", "b", "name"]) == [{"a": "x", "b": 1, "name": "x1b"}]


# -- invalid commands ----------------------------------------------------------------
@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_bad_commands_go_to_invalid_and_good_ones_land(tmp_path, flavor):
    uri = str(tmp_path / "t")
    items = [
        (1, _row(1, "ok"), 1, 10),
        ("1", _row(1, "str key"), 2, 10),                 # key of the wrong type
        (2, {"id": 2, "name": 5, "emb": [1.0, 1, 0, 0]}, 3, 10),   # name not a string
        (3, {"name": "no id", "emb": [1.0, 1, 0, 0]}, 4, 10),      # key column missing
        (4, _row(4, "offset nan"), float("nan"), 10),
        (5, _row(5, "ok5"), 5, 10),
        (5, _row(5, "bad offset class"), "x", 10),        # offsets of two classes at a key
    ]
    p = TestPipeline()
    result = (p | beam.Create([TimestampedValue(UpsertCommand(k, r, o), t)
                               for k, r, o, t in items])
              | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", flavor=flavor)
              .with_invalid_output())

    def check(got):
        assert len(got) >= 4, got
        for needle in ("str key", "offset nan", "no id"):
            assert any(needle in r for r in got), (needle, got)
    assert_that(result.invalid | beam.Map(lambda i: repr(i.element)), check)
    p.run().wait_until_finish()
    names = {r["id"]: r["name"] for r in _rows(uri, ["id", "name"])}
    assert names.get(1) in ("ok", None) and 2 not in names and 3 not in names and 4 not in names
    assert names.get(1) == "ok", names


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_rows_without_a_vector_on_a_vector_table(tmp_path, flavor):
    """A row lacking the indexed vector (or with a NaN in it) goes to invalid; it
    failed the job in the build step (conform filled the missing vector column
    with nulls, so validation let the row through)."""
    uri = str(tmp_path / "t")
    items = [(1, _row(1, "ok"), 1, 10),
             (2, {"id": 2, "name": "no vector"}, 2, 10),
             (3, {"id": 3, "name": "nan", "emb": [float("nan"), 0.0, 0.0, 0.0]}, 3, 10)]
    p = TestPipeline()
    result = (p | beam.Create([TimestampedValue(UpsertCommand(k, r, o), t)
                               for k, r, o, t in items])
              | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", vector_column="emb",
                                   flavor=flavor).with_invalid_output())
    invalid = result.invalid | beam.Map(lambda i: i.element[0])
    assert_that(invalid, equal_to([2, 3]))
    p.run().wait_until_finish()
    t = Supertable.open(uri)
    assert 1 in [r["id"] for r in t.to_arrow(columns=["id"]).to_pylist()]
    assert _ids(t.search(vector=[1.0, 1.0, 0.0, 0.5], k=5, columns=["id"]))[0] == 1


def test_upsert_to_supertable_sends_out_of_range_integers_to_invalid(table_location):
    """An int64 key or column value too large for its column is a malformed element.

    pyarrow raises OverflowError (an ArithmeticError, not a ValueError): it
    escaped the validation and failed the whole job.
    """
    uri, options = table_location
    schema = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("name", pa.string())])
    commands = [
        TimestampedValue(UpsertCommand(1, {"id": 1, "n": 1, "name": "kept"}, 1), 10),
        TimestampedValue(UpsertCommand(2**70, {"id": 2**70, "n": 1, "name": "x"}, 2), 10),
        TimestampedValue(UpsertCommand(3, {"id": 3, "n": 2**40, "name": "y"}, 3), 10),
        TimestampedValue(UpsertCommand(2**64, None, 4), 10),
    ]
    p = TestPipeline()
    result = (p | beam.Create(commands)
              | UpsertToSupertable(uri, schema=schema, primary_key="id",
                                   storage_options=options).with_invalid_output())
    assert_that(result.invalid | beam.Map(lambda i: (i.element.offset, "2**" in i.reason
                                                      or str(i.element.key) in i.reason
                                                      or "'n'" in i.reason)),
                equal_to([(2, True), (3, True), (4, True)]), label="Invalid")
    assert_that(result.commits | beam.Map(lambda c: c.rows), equal_to([1]), label="Commits")
    p.run().wait_until_finish()
    table = Supertable.open(uri, storage_options=options)
    assert table.to_arrow(columns=["id", "n", "name"]).to_pylist() == [
        {"id": 1, "n": 1, "name": "kept"}]


# -- the table written ---------------------------------------------------------------
TSCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string()),
                     ("emb", pa.list_(pa.float32(), D))])


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_replaced_rows_leave_text_and_vector_search(tmp_path, flavor):
    uri = str(tmp_path / "t")
    create = dict(schema=TSCHEMA, primary_key="id", vector_column="emb",
                  fts_columns=("body",), flavor=flavor)

    def row(i, body):
        return {"id": i, "body": body, "emb": [float(i), 1.0, 0.0, 0.0]}
    _run(uri, [(i, row(i, f"old{i} common"), i, 10) for i in range(6)], **create)
    _run(uri, [(1, row(1, "new1 common"), 10, 20), (2, None, 11, 20)], **create)
    again = Supertable.open(uri)
    for t in (again, Supertable.open(uri)):
        assert t.search(text="old1", k=10).num_rows == 0
        assert t.search(text="old2", k=10).num_rows == 0
        assert _ids(t.search(text="new1", k=10, columns=["id"])) == [1]
        assert sorted(_ids(t.search(text="common", k=10, columns=["id"]))) == [0, 1, 3, 4, 5]
        hits = _ids(t.search(vector=[1.0, 1.0, 0.0, 0.0], k=10, columns=["id"],
                             recall_target=1.0))
        assert sorted(hits) == [0, 1, 3, 4, 5]


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_small_batch_limits_give_the_same_table(tmp_path, monkeypatch, flavor):
    """Every flush path (validation batches, shard lists, lookup batches, Arrow
    batches) taken many times gives the table the default limits give."""
    import beam_supertable.transforms.upsert_apply as uw_apply
    import beam_supertable.transforms.upsert_table as uw_table
    import beam_supertable.transforms.upsert_validate as uw_validate
    import beam_supertable.transforms.upsert_write as uw
    items = [(k % 23, _row(k % 23, f"n{k}") if k % 5 else None, k, 10 + k % 4)
             for k in range(120)]
    _run(str(tmp_path / "big"), items, schema=SCHEMA, primary_key="id", flavor=flavor)
    # Each limit is patched where the stage that flushes by it reads it.
    for module, name in ((uw_validate, "VALIDATE_BATCH_ROWS"), (uw_apply, "SHARD_PART_COMMANDS"),
                         (uw_apply, "LOOKUP_BATCH_KEYS"), (uw, "ARROW_BATCH_ROWS")):
        assert getattr(module, name) == getattr(uw_table, name)
        monkeypatch.setattr(module, name, 2)
    small = str(tmp_path / "small")
    _run(small, items, schema=SCHEMA, primary_key="id", flavor=flavor)
    assert _rows(small, ["id", "name"]) == _rows(str(tmp_path / "big"), ["id", "name"])
    last = {}
    for k, r, o, t in sorted(items, key=lambda c: (c[3], c[2])):
        last[k] = r
    assert _rows(small, ["id", "name"]) == sorted(
        ({"id": k, "name": r["name"]} for k, r in last.items() if r is not None),
        key=lambda r: r["id"])
    t = Supertable.open(small)
    assert t.frontier == Supertable.open(str(tmp_path / "big")).frontier
    assert t.count_rows() == len({r["id"] for r in t.to_arrow(columns=["id"]).to_pylist()})
