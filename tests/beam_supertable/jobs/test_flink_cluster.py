"""Pipelines on a standalone Flink cluster (JobManager and TaskManager as
separate processes, ``flink_master=localhost:<port>``), including recovery
from a task that fails mid-job."""

import json
import os
import signal
import time

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_supertable import ReadFromSupertable, Supertable, WriteToSupertable
from beam_supertable.jobs import flink, upsert_changes
from beam_supertable.testing import FailFirstAttempt
from beam_upsert import Upsert
from tests.beam_supertable.jobs.flink_cluster import FlinkCluster, WorkerPool
from tests.beam_supertable.jobs.outputs import job_outputs
from tests.beam_supertable.jobs.test_flink import SCHEMA, _read_lines, _rows, _workload
from tests.beam_upsert.helpers import _Stamp, _WithTime, timestamped
from tests.beam_upsert.reference import reference_upsert

pytestmark = [pytest.mark.flink, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    jar = flink.job_server_jar()
    lib = os.path.join(os.path.dirname(jar), "beam-flink-job-server-lib")
    work = str(tmp_path_factory.mktemp("flink-cluster"))
    c = FlinkCluster(lib, work, slots=2, restart_attempts=6)
    try:
        c.start()
        print(f"\nFlink standalone cluster at {c.master} (logs in {work})")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def worker_pool(tmp_path_factory):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pool = WorkerPool(str(tmp_path_factory.mktemp("worker-pool")), root)
    try:
        yield pool.start()
    finally:
        pool.stop()


def _options(cluster, *extra):
    return flink.flink_options(2, cluster.master, *extra)


def test_failed_tasks_recover_with_exactly_once_table_contents(cluster, tmp_path):
    # The superfile build and the commit each fail on their first attempt,
    # after their side effects (an uploaded superfile, a landed commit); Flink
    # restarts the job and the rerun must neither lose nor duplicate a row.
    markers = tmp_path / "markers"
    markers.mkdir()
    n = 8000
    rows, x = _rows(n, seed=11)
    uri = str(tmp_path / "table")
    p = beam.Pipeline(options=_options(cluster))
    commits = (p | beam.Create(rows)
               | WriteToSupertable(uri, schema=SCHEMA, vector_column="emb",
                                   fts_columns=["body"], n_shards=2,
                                   on_stage=FailFirstAttempt(markers, ("build", "commit"))))
    _ = (commits | beam.Map(lambda c: json.dumps([c.version, c.rows]))
         | beam.io.WriteToText(str(tmp_path / "commits")))
    p.run().wait_until_finish()

    injected = sorted(os.listdir(markers))
    assert any(m.startswith("build-") for m in injected), injected
    assert any(m.startswith("commit-") for m in injected), injected
    failures = cluster.job_exceptions()
    assert any("injected failure" in f for f in failures), failures

    t = Supertable.open(uri)
    assert t.version == 1 and t.count_rows() == n
    table = t.to_arrow(columns=["_id", "n"])
    assert sorted(table["n"].to_pylist()) == list(range(n))
    assert len(set(table["_id"].to_pylist())) == n
    assert t.search(vector=x[777], k=1)["n"].to_pylist() == [777]
    assert _read_lines(str(tmp_path / "commits")) == [[1, n]]

    p = beam.Pipeline(options=_options(cluster))
    _ = (p | ReadFromSupertable(uri, columns=["_id", "n"])
         | beam.Map(lambda r: json.dumps([r["_id"], r["n"]]))
         | beam.io.WriteToText(str(tmp_path / "read")))
    p.run().wait_until_finish()
    assert sorted(map(tuple, _read_lines(str(tmp_path / "read")))) == sorted(
        zip(table["_id"].to_pylist(), table["n"].to_pylist()))


def test_main_job_on_the_cluster_equals_direct_runner(cluster, tmp_path):
    outputs = {}
    for runner, extra in (("direct", []),
                          ("flink", ["--runner=FlinkRunner", f"--flink_master={cluster.master}",
                                     "--parallelism=2", "--environment_type=LOOPBACK"])):
        out = str(tmp_path / runner / "changes.jsonl")
        upsert_changes.run(["--output", out] + extra)
        outputs[runner] = job_outputs(out)
    assert outputs["flink"] == outputs["direct"] and len(outputs["flink"][0]) > 100


def test_a_job_ships_no_jars_to_a_cluster_that_holds_the_runner(cluster, tmp_path):
    # Beam's own job server uploads its whole classpath (152 MB) with every
    # job; ours ships none, so a job starts in seconds. The job still runs on
    # the runner classes the cluster's classpath holds.
    before = cluster.uploaded_bytes()
    uri = str(tmp_path / "t")
    p = beam.Pipeline(options=_options(cluster))
    _ = (p | beam.Create([{"n": i} for i in range(100)])
         | WriteToSupertable(uri, schema=pa.schema([("n", pa.int64())])))
    p.run().wait_until_finish()
    assert Supertable.open(uri).count_rows() == 100
    assert cluster.uploaded_bytes() - before < 10 * 2 ** 20


def _wait_until_running(cluster, timeout=180):
    """The id of the cluster's running job once one of its tasks has started."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        jobs = [j for j in cluster.rest("/jobs")["jobs"] if j["status"] == "RUNNING"]
        if jobs:
            job_id = jobs[0]["id"]
            tasks = cluster.rest(f"/jobs/{job_id}")["status-counts"]
            if tasks.get("RUNNING", 0) + tasks.get("FINISHED", 0) > 0:
                return job_id
        time.sleep(0.2)
    pytest.fail("the job never started running on the cluster")


def test_killed_taskmanager_mid_job_recovers_exactly_once(cluster, tmp_path):
    # A real process failure: SIGKILL the TaskManager while the job runs,
    # start a new one, and the restarted job must land every row once.
    n = 30_000
    rows, _ = _rows(n, seed=5)
    uri = str(tmp_path / "table")
    p = beam.Pipeline(options=_options(cluster))
    _ = (p | beam.Create(rows)
         | WriteToSupertable(uri, schema=SCHEMA, vector_column="emb", fts_columns=["body"],
                             n_shards=2))
    result = p.run()
    victim = cluster.taskmanagers[-1]
    job_id = _wait_until_running(cluster)
    try:
        assert Supertable.open(uri).version == 0   # nothing committed yet: truly mid-job
    except FileNotFoundError:
        pass                                       # (not even created yet)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    cluster.start_taskmanager()
    result.wait_until_finish()

    failures = cluster.job_exceptions(job_id)
    assert failures, "the job went through no failure"
    assert cluster.rest(f"/jobs/{job_id}")["state"] == "FINISHED"
    t = Supertable.open(uri)
    assert t.version == 1 and t.count_rows() == n
    table = t.to_arrow(columns=["_id", "n"])
    assert sorted(table["n"].to_pylist()) == list(range(n))
    assert len(set(table["_id"].to_pylist())) == n


def _upsert_commands(n_keys, per_key, seed):
    """Upsert commands with deletes, several times per key, same-time offsets."""
    import random

    import pyarrow as pa
    from apache_beam.transforms.window import TimestampedValue

    from beam_upsert import UpsertCommand
    rnd = random.Random(seed)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    out, offset = [], 0
    for k in range(n_keys):
        for _ in range(per_key):
            offset += 1
            row = None if rnd.random() < 0.1 else {"id": k, "name": f"n{offset}",
                                                  "score": rnd.random()}
            out.append(TimestampedValue(UpsertCommand(k, row, offset),
                                        1_767_225_600 + rnd.randrange(20)))
    return schema, out


def test_upsert_to_supertable_survives_a_killed_taskmanager_like_a_clean_run(cluster, tmp_path):
    # The closed loop on the cluster: the TaskManager is SIGKILLed mid-job and
    # replaced; the restarted job's table must equal a clean DirectRunner run
    # (same live rows, same frontier, one commit).
    from beam_supertable import UpsertToSupertable
    schema, commands = _upsert_commands(4000, 5, seed=3)

    def run(uri, options):
        p = beam.Pipeline(options=options)
        _ = (p | beam.Create(commands)
             | UpsertToSupertable(uri, schema=schema, primary_key="id"))
        return p.run()

    clean = str(tmp_path / "clean")
    run(clean, None).wait_until_finish()
    uri = str(tmp_path / "killed")
    result = run(uri, _options(cluster))
    victim = cluster.taskmanagers[-1]
    job_id = _wait_until_running(cluster)
    try:
        assert Supertable.open(uri).frontier is None   # nothing applied yet: truly mid-job
    except FileNotFoundError:
        pass                                           # (not even created yet)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    cluster.start_taskmanager()
    result.wait_until_finish()

    assert cluster.job_exceptions(job_id), "the job went through no failure"
    assert cluster.rest(f"/jobs/{job_id}")["state"] == "FINISHED"
    want, got = Supertable.open(clean), Supertable.open(uri)
    assert got.frontier == want.frontier
    assert [h["operation"] for h in got.history()].count("upsert") == 1

    def live(t):
        return sorted(t.to_arrow(columns=["id", "name", "score"]).to_pylist(),
                      key=lambda r: r["id"])
    assert live(got) == live(want) and len(live(got)) > 3000


class _WorkerProcess(beam.DoFn):
    """Tags each element with the process (and its parent) that handled it."""

    def process(self, element):
        yield os.getpid(), os.getppid()


def test_stateful_upsert_on_external_worker_processes_equals_reference(
        cluster, worker_pool, tmp_path):
    # The sidecar deployment: the TaskManager asks the worker pool for SDK
    # workers (EXTERNAL), and the pool starts them as processes of its own.
    commands, prior = _workload(seed=5)
    expected = reference_upsert(commands, prior)
    options = _options(cluster, "--environment_type=EXTERNAL",
                       f"--environment_config={worker_pool.address}",
                       "--sdk_worker_parallelism=2")
    p = beam.Pipeline(options=options)
    cmds = (p | "Cmds" >> beam.Create(timestamped(commands)) | "Stamp" >> beam.ParDo(_Stamp()))
    changes = cmds | Upsert("stateful", prior=p | "Prior" >> beam.Create(prior))
    out = changes | beam.ParDo(_WithTime())
    _ = out | beam.Map(json.dumps) | beam.io.WriteToText(str(tmp_path / "changes"))
    _ = (changes | beam.ParDo(_WorkerProcess()) | beam.Distinct()
         | "Pids" >> beam.Map(json.dumps) | "WritePids" >> beam.io.WriteToText(
             str(tmp_path / "workers")))
    p.run().wait_until_finish()

    got = sorted(map(tuple, _read_lines(str(tmp_path / "changes"))), key=repr)
    assert got == sorted(expected, key=repr) and len(got) > 1000
    workers = _read_lines(str(tmp_path / "workers"))
    # Real worker processes, started by the pool, not threads of this process.
    assert workers and all(parent == worker_pool.process.pid for _, parent in workers), workers
    assert os.getpid() not in {pid for pid, _ in workers}


# -- a streaming UpsertToSupertable job, killed mid-stream ---------------------------------------
STREAM_BATCHES = 40    # one batch per second of event time: one commit slot each


def _write_stream_file(path, n_keys, batches, seed, start_s):
    """A command file for :class:`_CommandStream`: one JSON batch per line,
    ``{"at": seconds, "commands": [[key, row | null, offset], ...]}``."""
    import random
    rnd = random.Random(seed)
    offset = 0
    with open(path, "w") as f:
        for i in range(batches):
            batch = []
            for _ in range(rnd.randrange(40, 80)):
                offset += 1
                k = rnd.randrange(n_keys)
                row = None if rnd.random() < 0.15 else {"id": k, "name": f"n{offset}",
                                                       "score": rnd.random()}
                batch.append([k, row, offset])
            # Same key, same time, offsets against arrival order: the greater wins.
            k = rnd.randrange(n_keys)
            batch.append([k, {"id": k, "name": f"wins-{i}", "score": 1.0}, offset + 2])
            batch.append([k, {"id": k, "name": f"loses-{i}", "score": 0.0}, offset + 1])
            offset += 2
            f.write(json.dumps({"at": start_s + i, "commands": batch}) + "\n")


def _read_batches(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class _CommandsOfBatches(beam.DoFn):
    """A command file's batches -> upsert commands, each at its batch's time."""

    def process(self, path):
        from apache_beam.transforms.window import TimestampedValue

        from beam_upsert import UpsertCommand
        for batch in _read_batches(path):
            for key, row, offset in batch["commands"]:
                yield TimestampedValue(UpsertCommand(key, row, offset), batch["at"])


class _CommandStream(beam.PTransform):
    """A command file as an unbounded stream of timestamped upsert commands.

    A plain ParDo after a one-element Create, with its output declared
    unbounded, so UpsertToSupertable takes its unbounded path (per-firing
    commits). The watermark jumps to +inf once (Beam's Flink Impulse sends
    it right after its element), so every slot commits in one step at the
    end; :class:`_PacedCommandStream` advances it batch by batch. The Beam
    sources that are unbounded by construction do not work here: a
    splittable DoFn's deferred remainder never resumes on Beam 2.62's
    portable Flink runner (PeriodicImpulse, or an SDF over this file: the
    first batch came out, nothing after it).
    """

    def __init__(self, path):
        super().__init__()
        self._path = path

    def expand(self, pbegin):
        commands = (pbegin | "File" >> beam.Create([self._path])
                    | "Read" >> beam.ParDo(_CommandsOfBatches()))
        commands.is_bounded = False
        return commands


class _PaceBatches(beam.DoFn):
    """Emits a command file's batches one event-time step at a time.

    One watermark timer, chained: the firing at batch ``i``'s time emits
    batch ``i`` and sets the timer at batch ``i + 1``'s time, whose hold
    keeps this stage's output watermark there. Beam's Flink Impulse sends
    the final watermark right after its element, so without this every
    stage downstream sees +inf at once and fires all its timers (every
    commit of the stream) in one step that no checkpoint barrier can pass
    (an operator fires its due timers before it lets a barrier through).
    Here each step is its own bundle: the watermark moves one batch at a
    time, commits land one slot at a time, and checkpoints complete in
    between. (Processing-time timers cannot pace it: once the input
    watermark is +inf, Beam's Flink runner drops them as late.)
    """

    TICK = TimerSpec("tick", TimeDomain.WATERMARK)

    def __init__(self, path):
        self._path = path

    def setup(self):
        self._batches = _read_batches(self._path)

    def process(self, element, tick=beam.DoFn.TimerParam(TICK)):
        tick.set(Timestamp(self._batches[0]["at"]), dynamic_timer_tag="0")

    @on_timer(TICK)
    def emit(self, tag=beam.DoFn.DynamicTimerTagParam, tick=beam.DoFn.TimerParam(TICK)):
        from apache_beam.transforms.window import TimestampedValue

        from beam_upsert import UpsertCommand
        i = int(tag)
        if i == len(self._batches):
            return
        batch = self._batches[i]
        for key, row, offset in batch["commands"]:
            yield TimestampedValue(UpsertCommand(key, row, offset), batch["at"])
        if i + 1 < len(self._batches):
            tick.set(Timestamp(self._batches[i + 1]["at"]), dynamic_timer_tag=str(i + 1))
        elif i + 1 == len(self._batches):
            # One empty step after the last batch: a step's output can wait
            # in the stage's checkpoint buffer until the next step flushes it.
            tick.set(Timestamp(batch["at"] + 1), dynamic_timer_tag=str(i + 1))


class _PacedCommandStream(beam.PTransform):
    """A command file as an unbounded stream whose watermark advances batch
    by batch (:class:`_PaceBatches`), declared unbounded like
    :class:`_CommandStream`."""

    def __init__(self, path):
        super().__init__()
        self._path = path

    def expand(self, pbegin):
        commands = (pbegin | "Start" >> beam.Create([(0, None)])
                    | "Pace" >> beam.ParDo(_PaceBatches(self._path)))
        commands.is_bounded = False
        return commands


def _clean_stream_run(uri, schema, path):
    """The same batches as a TestStream on the DirectRunner: the watermark
    passes each batch's time after the batch."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    from beam_supertable import UpsertToSupertable
    from beam_upsert import UpsertCommand
    stream = TestStream()
    for batch in _read_batches(path):
        stream = stream.add_elements([TimestampedValue(UpsertCommand(k, r, o), batch["at"])
                                      for k, r, o in batch["commands"]])
        stream = stream.advance_watermark_to(batch["at"] + 0.5)
    p = beam.Pipeline(options=PipelineOptions(streaming=True))
    _ = (p | stream.advance_watermark_to_infinity()
         | UpsertToSupertable(uri, schema=schema, primary_key="id"))
    p.run().wait_until_finish()


def _last_per_key(path):
    """The reference: each key's command with the greatest (time, offset)."""
    last = {}
    for batch in _read_batches(path):
        for k, row, offset in batch["commands"]:
            if k not in last or (batch["at"], offset) > last[k][0]:
                last[k] = ((batch["at"], offset), row)
    return sorted((row for _, row in last.values() if row), key=lambda r: r["id"])


def _checkpoints_completed(cluster, job_id):
    try:
        return cluster.rest(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]
    except (OSError, KeyError):
        return 0


def test_streaming_upsert_to_supertable_on_the_cluster_equals_a_clean_run(cluster, tmp_path):
    # The unbounded path on Flink in streaming mode: one commit per second of
    # event time, the same table and the same frontier as the DirectRunner
    # (Flink keeps timers in milliseconds; the frontier comes from the timer's
    # tag, not its truncated timestamp).
    import pyarrow as pa

    from beam_supertable import UpsertToSupertable
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    path = str(tmp_path / "commands.jsonl")
    _write_stream_file(path, 200, 12, seed=4, start_s=1_767_225_600)
    clean = str(tmp_path / "clean")
    _clean_stream_run(clean, schema, path)
    uri = str(tmp_path / "flink")
    p = beam.Pipeline(options=_options(cluster, "--streaming"))
    _ = p | _CommandStream(path) | UpsertToSupertable(uri, schema=schema, primary_key="id")
    p.run().wait_until_finish()
    want, got = Supertable.open(clean), Supertable.open(uri)
    assert got.frontier == want.frontier == (1_767_225_600 + 12) * 1_000_000
    assert [h["operation"] for h in got.history()].count("upsert") == 12

    def live(t):
        return sorted(t.to_arrow(columns=["id", "name", "score"]).to_pylist(),
                      key=lambda r: r["id"])
    assert live(got) == live(want) == _last_per_key(path)


def test_streaming_upsert_to_supertable_survives_a_killed_taskmanager_like_a_clean_run(
        cluster, tmp_path):
    # A streaming job (--streaming, a checkpoint every second) reads an
    # unbounded source into UpsertToSupertable, which commits once per second
    # of event time. Once a checkpoint has completed and a commit has landed,
    # the TaskManager is SIGKILLed and replaced: Flink restores the last
    # checkpoint (the upsert's shard state, the committer's buffer, the
    # source's position) and fires again what came after it; the commits that
    # landed after that checkpoint find their tokens. The table must equal a
    # clean run's: same live rows, same frontier, no key twice, nothing lost.
    import pyarrow as pa

    from beam_supertable import UpsertToSupertable
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    path = str(tmp_path / "commands.jsonl")
    _write_stream_file(path, 400, STREAM_BATCHES, seed=8, start_s=1_767_225_600)

    clean = str(tmp_path / "clean")
    _clean_stream_run(clean, schema, path)
    want = Supertable.open(clean)
    assert want.version > STREAM_BATCHES // 2          # one commit per slot, not one in all

    uri = str(tmp_path / "killed")
    # The paced source moves the watermark one batch per step, so commits
    # land one slot at a time with checkpoints between them.
    # --finish_bundle_before_checkpointing: by default Beam finishes a bundle
    # inside the snapshot and buffers its output in the checkpoint, to be
    # sent on the stage's next element or watermark; a stage that gets
    # neither (the one after the Impulse) holds it until the job ends.
    # Beam keeps the Impulse source (and the job) alive while checkpointing
    # until it has been idle this long; it starts again with a restored job.
    p = beam.Pipeline(options=_options(cluster, "--streaming", "--checkpointing_interval=1000",
                                       "--finish_bundle_before_checkpointing",
                                       "--shutdown_sources_after_idle_ms=90000"))
    commands = p | _PacedCommandStream(path)
    _ = commands | UpsertToSupertable(uri, schema=schema, primary_key="id")
    result = p.run()
    victim = cluster.taskmanagers[-1]
    job_id = _wait_until_running(cluster)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            landed = Supertable.open(uri).frontier is not None
        except FileNotFoundError:
            landed = False
        if landed and _checkpoints_completed(cluster, job_id) >= 1:
            break
        time.sleep(0.05)
    else:
        pytest.fail("no commit and completed checkpoint before the kill")
    killed_at = Supertable.open(uri).frontier
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert killed_at < want.frontier, "the stream had already been committed: not mid-stream"
    cluster.start_taskmanager()
    result.wait_until_finish()

    assert cluster.job_exceptions(job_id), "the job went through no failure"
    assert cluster.rest(f"/jobs/{job_id}")["state"] == "FINISHED"
    assert cluster.rest(f"/jobs/{job_id}/checkpoints")["counts"]["restored"] >= 1
    got = Supertable.open(uri)
    assert got.frontier == want.frontier
    fronts = [got.checkout(v).frontier for v in range(1, got.version + 1)]
    assert fronts == sorted(fronts)                    # only ever moved forward

    def live(t):
        return sorted(t.to_arrow(columns=["id", "name", "score"]).to_pylist(),
                      key=lambda r: r["id"])
    rows = live(got)
    assert len({r["id"] for r in rows}) == len(rows)   # no key twice
    assert rows == live(want) == _last_per_key(path) and len(rows) > 300


class _ChangeToCommand(beam.DoFn):
    """A change -> an upsert command at its time: an insertion wins over a
    retraction of its key at the same version (greater offset)."""

    def process(self, change, at=beam.DoFn.TimestampParam):
        from apache_beam.transforms.window import TimestampedValue

        from beam_upsert import UpsertCommand
        if change.diff > 0:
            yield TimestampedValue(UpsertCommand(change.key, change.value, 1), at)
        else:
            yield TimestampedValue(UpsertCommand(change.key, None, 0), at)


@pytest.mark.parametrize("consumer", [None, "mirror"])
def test_a_tailing_change_feed_resumes_from_a_checkpoint_after_a_killed_taskmanager(
        cluster, tmp_path, consumer):
    # A streaming job tails a table that a writer keeps changing and mirrors
    # its changes into a second table through UpsertToSupertable. Once a
    # checkpoint has completed and the mirror has a commit, the TaskManager
    # is SIGKILLed and replaced: Flink restores the reader's state (the next
    # version to emit) and timer, and the mirror must end equal to the table.
    # A named reader does the same while another thread vacuums in a loop down
    # to one version: the consumer's record keeps what the restored reader needs.
    import random
    import threading

    import pyarrow as pa
    import pyarrow.compute as pc

    from beam_supertable import ReadChangesFromSupertable, UpsertToSupertable
    schema = pa.schema([("id", pa.int64()), ("label", pa.string())])
    source = Supertable.create(str(tmp_path / "source"), schema, primary_key="id",
                               iceberg=False)
    source.upsert(pa.table({"id": list(range(30)), "label": ["v0"] * 30}))
    versions, gap = 60, 0.25
    stop = threading.Event()

    def writer():
        rng = random.Random(5)
        t = Supertable.open(source.uri)
        for i in range(versions):
            if stop.wait(gap):
                return
            if i % 5 == 4:
                t.delete(pc.field("id").isin(rng.sample(range(40), 3)))
            else:
                keys = sorted(rng.sample(range(40), 4))
                t.upsert(pa.table({"id": keys, "label": [f"v{i + 1}"] * 4}, schema=schema))

    start = source.version
    end = start + versions
    mirror = str(tmp_path / "mirror")
    removed = []

    def vacuum():
        # A grace longer than a commit takes from upload to version, as the
        # operating guide asks: a commit in flight keeps its files.
        t = Supertable.open(source.uri)
        while not stop.wait(0.5):
            removed.extend(t.vacuum(retain_versions=1, older_than=2).removed_versions)
    p = beam.Pipeline(options=_options(cluster, "--streaming", "--checkpointing_interval=1000",
                                       "--finish_bundle_before_checkpointing",
                                       "--shutdown_sources_after_idle_ms=90000"))
    _ = (p | ReadChangesFromSupertable(source.uri, start_version=start, end_version=end,
                                       poll_interval=0.1, consumer=consumer)
         | beam.ParDo(_ChangeToCommand())
         | UpsertToSupertable(mirror, schema=schema, primary_key="id", flavor="stateful"))
    result = p.run()
    victim = cluster.taskmanagers[-1]
    job_id = _wait_until_running(cluster)
    threads = [threading.Thread(target=writer)] + (
        [threading.Thread(target=vacuum)] if consumer else [])
    for thread in threads:
        thread.start()
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                landed = Supertable.open(mirror).frontier is not None
            except FileNotFoundError:
                landed = False
            if landed and _checkpoints_completed(cluster, job_id) >= 1:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no mirror commit and completed checkpoint before the kill")
        assert Supertable.open(source.uri).version < end, "the writer finished: not mid-stream"
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        cluster.start_taskmanager()
        result.wait_until_finish()
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    assert cluster.job_exceptions(job_id), "the job went through no failure"
    if consumer:
        assert removed, "the vacuum removed nothing: it never raced the reader"
        (held,) = Supertable.open(source.uri).consumers()
        assert start <= held.version <= end
    assert cluster.rest(f"/jobs/{job_id}")["state"] == "FINISHED"
    assert cluster.rest(f"/jobs/{job_id}/checkpoints")["counts"]["restored"] >= 1

    def live(uri):
        return sorted(Supertable.open(uri).to_arrow(columns=["id", "label"]).to_pylist(),
                      key=lambda r: r["id"])
    assert Supertable.open(source.uri).version == end
    assert live(mirror) == live(source.uri) and len(live(mirror)) > 20
