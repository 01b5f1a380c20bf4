"""Upsert and WriteToSupertable on Flink against the DirectRunner, same run.

    python -m benchmarks.flink_bench                 # every case, every runner
    python -m benchmarks.flink_bench --small         # a tenth of the input
    python -m benchmarks.flink_bench --case write --case upsert-table --stages \
        --runner direct --runner flink --runner flink-cluster --runner flink-cluster-external
    python -m benchmarks.flink_bench --case stateful --runner flink-streaming
    python -m benchmarks.flink_bench --runner flink --flink_master=localhost:8081 \
        --job_endpoint=localhost:8099 --environment_type=EXTERNAL \
        --environment_config=localhost:50000     # your own running cluster

Run it in the Flink environment (apache-beam matching the job server, see
beam_supertable/jobs/flink.py); it is not part of any test suite. Every (case, runner)
runs in its own process and reads its input from files under
benchmarks/data/ (the upsert benchmark's commands and snapshot, and a
Parquet file of vector rows), so job start is included in each figure, as a
user sees it. Cases:

* ``pardo``: read and parse the commands, one plain ParDo (the floor).
* ``grouped`` / ``stateful``: ``Upsert(flavor, prior=snapshot)`` over the
  commands (200,000 over 50,000 keys, a 25,000-key snapshot);
  ``stateful-no-tombstones`` is ``stateful`` with ``tombstone_retention=0``
  (deleted keys keep nothing), to measure what tombstones cost.
* ``write``: ``WriteToSupertable`` of vector + text rows (rows/s).
* ``upsert-table``: the closed loop, ``UpsertToSupertable`` (grouped,
  bounded) of the same commands as rows ``{key, value}`` into a keyed table
  holding the 25,000-key snapshot (built before the clock starts).
* ``upsert-table-stream``: the same commands as an unbounded stream (the
  file's PCollection declared unbounded) into ``UpsertToSupertable`` on an
  empty keyed table (``key``, ``value``): the stateful flavor per state
  shard and one commit per second of event time (10 commits). Runs on
  ``direct`` and ``flink-streaming`` only.

The ``write`` and ``upsert-table`` lines end with an order-free digest of
the table's user columns afterwards: equal digests on both runners mean
identical table contents.

Each line also gives the job start (seconds from submitting the pipeline
to its first bundle) and items per second after it. Under each Flink line
the job start is broken down by the job server's log (and, on a running
cluster, its REST API): ``client`` (pipeline built and serialized),
``JVM`` (the job server's JVM), ``connect`` (the client reaching it),
``stage`` (artifacts), ``prepare``, ``translate`` (pipeline -> Flink
program), ``cluster`` (the embedded mini cluster), ``submit`` (the job
graph, with the job server's jars, reaching the JobManager), ``schedule``
(job running), ``worker`` (first SDK worker connected) and ``first
bundle``. ``--stages`` adds each Flink stage's start and duration.

Besides items per wall-clock second, each line gives items per CPU-second
of the submitting process, where the DirectRunner and LOOPBACK workers run:
on a shared machine that is the per-worker rate (EXTERNAL workers run in
their own processes, so that column then counts only the submitter).

Runners:

* ``direct``: the DirectRunner.
* ``flink``: batch, ``--flink_master`` (default ``[local]``: the FlinkRunner
  starts a job server and in it an embedded cluster for each job), or a
  running job server with ``--job_endpoint``.
* ``flink-cluster``: batch on a running standalone cluster (JobManager and
  TaskManager JVMs, ``parallelism`` slots) and a job server on it, both
  started before the clock (and warmed up by one small job), LOOPBACK
  workers: what a user submitting to a running cluster sees.
* ``flink-cluster-external``: the same with EXTERNAL workers, a Beam worker
  pool beside the TaskManager (``--sdk_worker_parallelism`` = parallelism).
* ``flink-streaming``: ``--streaming`` (Upsert cases only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from beam_supertable import Supertable, UpsertToSupertable, WriteToSupertable
from beam_supertable.format.digest import row_digest
from beam_upsert import UpsertCommand
from benchmarks import upsert_bench

DATA = upsert_bench.DATA
SMALL_COMMANDS, SMALL_PRIOR = 20_000, 2_500
WRITE_ROWS, SMALL_WRITE_ROWS, DIM = 50_000, 5_000, 64
CASES = ("pardo", "grouped", "stateful", "stateful-no-tombstones", "write", "upsert-table",
         "upsert-table-stream")
TABLE_SCHEMA = pa.schema([pa.field("key", pa.string(), nullable=False), ("value", pa.int64())])
STREAM_CASES = ("upsert-table-stream",)   # unbounded input: no Flink batch run
RUNNERS = ("direct", "flink", "flink-cluster", "flink-cluster-external", "flink-streaming")
CLUSTER_RUNNERS = ("flink-cluster", "flink-cluster-external")


def _files(small: bool):
    upsert_bench.make_data()
    commands, prior = upsert_bench._path("commands.jsonl"), upsert_bench._path("prior.jsonl")
    if not small:
        return commands, prior, upsert_bench.N_COMMANDS
    out = (upsert_bench._path("commands_small.jsonl"), upsert_bench._path("prior_small.jsonl"))
    for src, dst, n in ((commands, out[0], SMALL_COMMANDS), (prior, out[1], SMALL_PRIOR)):
        if not os.path.exists(dst):
            with open(src) as f, open(dst + ".tmp", "w") as g:
                for _, line in zip(range(n), f):
                    g.write(line)
            os.replace(dst + ".tmp", dst)
    return out[0], out[1], SMALL_COMMANDS


def _rows_file(n: int) -> str:
    path = os.path.join(DATA, f"flink_bench_rows_{n}.parquet")
    if not os.path.exists(path):
        os.makedirs(DATA, exist_ok=True)
        rng = np.random.default_rng(0)
        centers = rng.normal(size=(200, DIM)).astype(np.float32)
        x = centers[rng.integers(0, 200, n)] + rng.normal(size=(n, DIM)).astype(np.float32)
        words = np.array("alpha beta gamma delta river stone cloud forest ember frost".split())
        table = pa.table({
            "n": np.arange(n),
            "body": [" ".join(rng.choice(words, 6)) for _ in range(n)],
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM),
        })
        pq.write_table(table, path + ".tmp", row_group_size=5_000)
        os.replace(path + ".tmp", path)
    return path


def parse_row_command(line):
    """A command of the upsert benchmark as a row command of the keyed table."""
    row = json.loads(line)
    value = None if row["value"] is None else {"key": row["key"], "value": row["value"]}
    return TimestampedValue(UpsertCommand(row["key"], value, row["offset"]), row["time"])


def _keyed_table(uri: str, prior: str) -> None:
    """The keyed table holding the snapshot (not timed: it is the loop's prior)."""
    with open(prior) as f:
        rows = [json.loads(line) for line in f]
    table = Supertable.create(uri, TABLE_SCHEMA, primary_key="key")
    table.upsert(pa.Table.from_pylist(rows, schema=TABLE_SCHEMA))


def _contents(uri: str) -> str:
    """Order-free digest of the table's user columns (``_id`` s differ per run)."""
    table = Supertable.open(uri)
    return row_digest(table.to_arrow(columns=table.user_schema.names))


class _MarkStart(beam.DoFn):
    """Writes the wall-clock time of the job's first bundle to a file (once).

    The time from submitting the pipeline to it is the job start: on Flink
    the job server's and the cluster's start-up, before any element moves.
    """

    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, element):
        try:
            fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, repr(time.time()).encode())
        os.close(fd)


def _command_row(command):
    """A benchmark command as a command on the (key, value) table."""
    from beam_upsert import UpsertCommand
    value = None if command.value is None else {"key": command.key, "value": command.value}
    return UpsertCommand(command.key, value, command.offset)


def _upsert_table_stream(p, commands: str, table: str) -> None:
    """``upsert-table-stream``: the command file, declared unbounded, into UpsertToSupertable."""
    from beam_supertable import UpsertToSupertable
    cmds = (p | "Read" >> beam.io.ReadFromText(commands)
            | "Parse" >> beam.Map(upsert_bench.parse_command)
            | "AsRows" >> beam.Map(_command_row))
    cmds.is_bounded = False   # a stream replayed from a file: the unbounded path
    schema = pa.schema([("key", pa.string()), ("value", pa.int64())])
    _ = cmds | UpsertToSupertable(table, schema=schema, primary_key="key")


class _Drain(beam.DoFn):
    def process(self, element):
        return ()


def _options(runner: str, args) -> PipelineOptions:
    if runner == "direct":
        return PipelineOptions()
    from beam_supertable.jobs import flink
    extra = [f"--environment_type={args.environment_type}"]
    if args.environment_config:
        extra.append(f"--environment_config={args.environment_config}")
    if args.environment_type != "LOOPBACK":
        # One SDK worker process per parallel task (Flink's default is one
        # per TaskManager, whatever its slots).
        extra.append(f"--sdk_worker_parallelism={args.parallelism}")
    if runner == "flink-streaming":
        extra.append("--streaming")
    extra.extend(args.flink_option or ())
    if args.job_endpoint:
        extra.append(f"--job_endpoint={args.job_endpoint}")
    argv = ["--runner=FlinkRunner", f"--flink_master={args.flink_master}",
            f"--parallelism={args.parallelism}", *extra]
    return flink.fill_defaults(PipelineOptions(argv), argv)

# The TaskManager has the job server's jars on its classpath (as a deployment
# that puts them in Flink's lib/ does). Loading them parent-first makes the
# Beam classes the job ships the same as the TaskManager's, and only then does
# Beam keep a job's SDK workers between stages (--environment_cache_millis):
# it releases them at once when its classes come from the job's own
# class loader. Without it every stage of a batch job starts new workers.
CLUSTER_CONF = {"classloader.resolve-order": "parent-first"}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _RunningCluster:
    """A standalone Flink cluster and a job server on it, started before any clock runs.

    What a production user submits to: a JobManager and a TaskManager
    (``parallelism`` slots) as their own JVMs, and Beam's Flink job server,
    from the same jar the FlinkRunner uses, started once
    (``java -jar <jar> --flink-master host:port --job-port P``); pipelines
    go to it with ``--job_endpoint=localhost:P``. For EXTERNAL workers a
    Beam worker pool (``worker_pool_main``) runs beside the TaskManager.
    The job server's output is kept, timestamped, in ``job_server.log`` for
    the job start breakdown. One small job warms the cluster up first.
    """

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.work = tempfile.mkdtemp(prefix="flink-bench-cluster-")
        self.log_path = os.path.join(self.work, "job_server.log")
        self.cluster = self.job_server = self.pool = None
        self.endpoint = None

    def start(self) -> "_RunningCluster":
        import socket
        import threading

        from beam_supertable.jobs import flink
        from tests.beam_supertable.jobs.flink_cluster import FlinkCluster
        jar = flink.job_server_jar()
        lib = os.path.join(os.path.dirname(jar), "beam-flink-job-server-lib")
        self.cluster = FlinkCluster(lib, self.work, slots=self.parallelism,
                                    conf=CLUSTER_CONF).start()
        port = _free_port()
        self.endpoint = f"localhost:{port}"
        self.job_server = subprocess.Popen(
            ["java", "-jar", jar, "--flink-master", self.cluster.master,
             "--artifacts-dir", os.path.join(self.work, "artifacts"), "--job-port", str(port),
             "--artifact-port", "0", "--expansion-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

        def keep_log(out, path):
            with open(path, "w") as f:
                for line in out:
                    f.write(f"{time.time():.3f} {line.decode(errors='replace')}")
                    f.flush()

        threading.Thread(target=keep_log, args=(self.job_server.stdout, self.log_path),
                         daemon=True).start()
        deadline = time.time() + 120
        while True:
            if self.job_server.poll() is not None:
                raise RuntimeError(f"the job server exited; see {self.log_path}")
            try:
                with socket.create_connection(("localhost", port), timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    raise TimeoutError(f"job server: port {port} not open; see {self.log_path}")
                time.sleep(0.3)
        return self

    def pool_address(self) -> str:
        if self.pool is None:
            from tests.beam_supertable.jobs.flink_cluster import WorkerPool
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            self.pool = WorkerPool(self.work, root).start()
        return self.pool.address

    def workers_started(self) -> int:
        """SDK worker processes the pool has started so far."""
        if self.pool is None:
            return 0
        with open(os.path.join(self.work, "worker-pool.log"), errors="replace") as f:
            return sum(line.startswith("Starting worker") for line in f)

    def args(self, runner: str) -> list:
        """The bench flags that send a case to this cluster."""
        out = [f"--flink_master={self.cluster.master}", f"--job_endpoint={self.endpoint}",
               f"--job_server_log={self.log_path}"]
        if runner == "flink-cluster-external":
            out += ["--environment_type=EXTERNAL", f"--environment_config={self.pool_address()}"]
        return out

    def warm_up(self, runner: str) -> None:
        """One small job first: a production cluster has run jobs before."""
        subprocess.run([sys.executable, "-m", "benchmarks.flink_bench", "--one", "--case=pardo",
                        f"--runner={runner}", "--small", f"--parallelism={self.parallelism}",
                        *self.args(runner)], capture_output=True, check=True)

    def stop(self) -> None:
        from tests.beam_supertable.jobs.flink_cluster import stop_group
        if self.job_server is not None:
            stop_group(self.job_server)
        if self.pool is not None:
            self.pool.stop()
        if self.cluster is not None:
            self.cluster.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def run_case(case: str, runner: str, args) -> dict:
    """Runs one case on one runner in this process; returns its figures."""
    commands, prior, n = _files(args.small)
    options = _options(runner, args)
    work = tempfile.mkdtemp(prefix="flink-bench-")
    uri, contents = os.path.join(work, "table"), None
    log = _JobServerLog() if runner != "direct" and not args.job_endpoint else None
    try:
        if case == "upsert-table":
            _keyed_table(uri, prior)
        started = os.path.join(work, "started")
        t0, wall0, cpu0 = time.perf_counter(), time.time(), _cpu()
        with beam.Pipeline(options=options) as p:
            _ = p | "Start" >> beam.Create([None]) | "MarkStart" >> beam.ParDo(_MarkStart(started))
            if case == "upsert-table-stream":
                _upsert_table_stream(p, commands, uri)
            elif case == "write":
                n = SMALL_WRITE_ROWS if args.small else WRITE_ROWS
                src = _rows_file(n)
                _ = (p | beam.io.ReadFromParquet(src)
                     | WriteToSupertable(uri, schema=pq.read_schema(src),
                                         vector_column="emb", fts_columns=["body"]))
            elif case == "upsert-table":
                _ = (p | "Read" >> beam.io.ReadFromText(commands)
                     | "Parse" >> beam.Map(parse_row_command)
                     | UpsertToSupertable(uri, flavor="grouped"))
            else:
                cmds = (p | "Read" >> beam.io.ReadFromText(commands)
                        | "Parse" >> beam.Map(upsert_bench.parse_command))
                if case == "pardo":
                    out = cmds
                else:
                    from beam_upsert import Upsert
                    snapshot = (p | "ReadPrior" >> beam.io.ReadFromText(prior)
                                | "ParsePrior" >> beam.Map(upsert_bench.parse_prior))
                    if case == "stateful-no-tombstones":   # the layout before tombstones
                        out = cmds | Upsert("stateful", prior=snapshot, tombstone_retention=0)
                    else:
                        out = cmds | Upsert(case, prior=snapshot)
                _ = out | beam.ParDo(_Drain())
        seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
        with open(started) as f:
            first_bundle = float(f.read())
        start = first_bundle - wall0
        if case in ("write", "upsert-table", "upsert-table-stream"):
            contents = _contents(uri)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if log is not None:
            log.close()
    phases, stages, workers = {}, [], None
    if runner != "direct":
        lines = log.lines if log is not None else _read_job_server_log(args.job_server_log, wall0)
        events = _milestones(lines)
        if args.job_endpoint:
            job_events, stages = _rest_job(args.flink_master, wall0)
            events.update(job_events)
        else:
            stages = _log_stages(lines)
        events["first bundle"] = first_bundle
        phases = _phases(events, wall0)
        if not args.job_endpoint:
            workers = sum("Beam Fn Control client connected" in text for _, text in lines)
    return {"case": case, "runner": runner, "n": n, "seconds": seconds, "per_second": n / seconds,
            "cpu_seconds": cpu, "per_cpu_second": n / cpu, "contents": contents,
            "start_seconds": start, "after_start_per_second": n / (seconds - start),
            "phases": phases, "stages": stages, "workers": workers}


# -- where the job start goes ---------------------------------------------------------------------
# Milestones of a job's start, as the job server logs them: (name, log text),
# in the order they happen. With flink_master=[local] the job server (and in
# it the embedded cluster) starts with the job and its log comes through
# Beam's subprocess_server logger; with a running job server (--job_endpoint)
# the bench reads the log it keeps of that server, and the job's own
# milestones (submitted, running) come from the cluster's REST API.
MILESTONES = (
    ("job server started", "Starting service with"),
    ("job server up", "JobService started on"),
    ("staging", "Staging artifacts for"),
    ("staged", "Artifacts fully staged"),
    ("invoked", "Invoking job"),
    ("translated", "Starting Flink Mini Cluster"),                 # [local]
    ("translated", "RestClusterClient - Submitting job"),          # a running cluster
    ("cluster up", "Flink Mini Cluster started successfully"),
    ("submitted", "Received JobGraph submission"),
    ("running", "switched from state CREATED to RUNNING"),
    ("first worker", "Beam Fn Control client connected"),
)
# What each phase (from the milestone before it) is, for the breakdown line.
PHASES = (
    ("job server started", "client"),    # the pipeline built and serialized
    ("job server up", "JVM"),            # [local]: the job server's JVM start
    ("staging", "connect"),              # to the job server (with --job_endpoint: and client)
    ("staged", "stage"),                 # artifact staging
    ("invoked", "prepare"),
    ("translated", "translate"),         # pipeline -> Flink program
    ("cluster up", "cluster"),           # [local]: the embedded mini cluster start
    ("submitted", "submit"),             # the job graph (and the job server's jars) uploaded
    ("running", "schedule"),             # JobMaster set up, job running
    ("first worker", "worker"),          # tasks deployed, first SDK worker connected
    ("first bundle", "first bundle"),
)


class _JobServerLog(logging.Handler):
    """Timestamps the lines Beam's FlinkRunner relays from the job server it starts."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = []
        self._logger = logging.getLogger("apache_beam.utils.subprocess_server")
        self._level, self._propagate = self._logger.level, self._logger.propagate
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False      # keep the job server's chatter off stderr
        self._logger.addHandler(self)

    def emit(self, record) -> None:
        self.lines.append((record.created, record.getMessage()))

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
        self._logger.propagate = self._propagate
        super().close()


def _read_job_server_log(path, since: float):
    lines = []
    if not path:
        return lines
    with open(path, errors="replace") as f:
        for line in f:
            stamp, _, text = line.partition(" ")
            try:
                t = float(stamp)
            except ValueError:
                continue
            if t >= since:
                lines.append((t, text.rstrip("\n")))
    return lines


def _milestones(lines) -> dict:
    events = {}
    for t, text in lines:
        for name, marker in MILESTONES:
            if name not in events and marker in text:
                events[name] = t
    return events


def _phases(events: dict, wall0: float) -> dict:
    """Seconds per phase of the job start, each from the milestone before it."""
    out, last = {}, wall0
    for name, label in PHASES:
        if name in events and events[name] >= last:
            out[label] = events[name] - last
            last = events[name]
    return out


_VERTEX = re.compile(r"ExecutionGraph - (.*?) \(\d+/\d+\) \(\S+\) switched from \w+ to (\w+)")


def _log_stages(lines):
    """Per-vertex (first running, last finished) from the embedded cluster's log."""
    running, finished, order = {}, {}, []
    for t, text in lines:
        m = _VERTEX.search(text)
        if not m:
            continue
        name = m.group(1)
        if name not in order:
            order.append(name)
        if m.group(2) == "RUNNING":
            running.setdefault(name, t)
        elif m.group(2) == "FINISHED":
            finished[name] = t
    return [(name, running[name], finished[name]) for name in order
            if name in running and name in finished]


def _rest(master: str, path: str):
    import urllib.request
    with urllib.request.urlopen(f"http://{master}{path}", timeout=10) as r:
        return json.load(r)


def _rest_job(master: str, since: float):
    """The latest job on a running cluster: its milestones and per-vertex times."""
    jobs = [j for j in _rest(master, "/jobs/overview")["jobs"] if j["start-time"] >= since * 1000]
    if not jobs:
        return {}, []
    job = _rest(master, f"/jobs/{max(jobs, key=lambda j: j['start-time'])['jid']}")
    stamps = job.get("timestamps", {})
    events = {"submitted": job["start-time"] / 1000}
    if stamps.get("RUNNING"):
        events["running"] = stamps["RUNNING"] / 1000
    stages = [(v["name"], v["start-time"] / 1000, v["end-time"] / 1000)
              for v in job["vertices"] if v.get("start-time", -1) > 0 and v.get("end-time", -1) > 0]
    return events, sorted(stages, key=lambda s: s[1])


def _print_phases(r: dict) -> None:
    if r.get("phases"):
        parts = ", ".join(f"{label} {s:.1f}" for label, s in r["phases"].items())
        workers = "" if r.get("workers") is None else f"; SDK workers started: {r['workers']}"
        print(f"{'':12s} {'':16s} job start {r['start_seconds']:.1f} s: {parts}{workers}",
              flush=True)


def _print_stages(r: dict) -> None:
    stages = r.get("stages") or []
    if not stages:
        return
    t0 = min(s[1] for s in stages)
    for name, begin, end in stages:
        name = re.sub(r"\(MapPartition at \[\d+\]", "(", name)
        print(f"{'':12s} {'':16s}   {begin - t0:6.1f} +{end - begin:5.1f} s  {name[:100]}")


def _cpu() -> float:
    # CPU time of this process: with LOOPBACK (and the DirectRunner) the
    # Python workers run here, so items per CPU-second is the per-worker
    # rate, whatever else the machine runs. EXTERNAL workers run elsewhere.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _describe(runner: str, args) -> str:
    if runner == "direct":
        return "DirectRunner"
    mode = "streaming" if runner == "flink-streaming" else "batch"
    if runner in CLUSTER_RUNNERS:
        workers = ("EXTERNAL (a worker pool beside the TaskManager)"
                   if runner == "flink-cluster-external" else args.environment_type)
        return (f"Flink {mode}, {workers}, parallelism {args.parallelism}, a running standalone "
                "cluster (JobManager + TaskManager) and job server, started before the clock")
    where = args.flink_master + (f", job server {args.job_endpoint}" if args.job_endpoint else "")
    return f"Flink {mode}, {args.environment_type}, parallelism {args.parallelism}, master {where}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, action="append",
                        help="a case to run (repeatable; default: all)")
    parser.add_argument("--runner", choices=RUNNERS, action="append",
                        help="a runner to run on (repeatable; default: all)")
    parser.add_argument("--small", action="store_true",
                        help=f"{SMALL_COMMANDS:,} commands and {SMALL_WRITE_ROWS:,} rows")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--flink_master", default="[local]")
    parser.add_argument("--environment_type", default="LOOPBACK",
                        help="LOOPBACK (workers in this process) or EXTERNAL (a worker pool)")
    parser.add_argument("--environment_config", default=None,
                        help="host:port of the worker pool for EXTERNAL")
    parser.add_argument("--flink_option", action="append", metavar="--NAME=VALUE",
                        help="a pipeline option passed to the Flink runs (repeatable)")
    parser.add_argument("--job_endpoint", default=None,
                        help="a running job server (host:port) to submit to, with --flink_master "
                             "its cluster's REST address")
    parser.add_argument("--job_server_log", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stages", action="store_true",
                        help="also print each Flink stage's start and duration")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases, runners = args.case or list(CASES), args.runner or list(RUNNERS)
    if args.one:
        print("RESULT " + json.dumps(run_case(cases[0], runners[0], args)), flush=True)
        return
    passed = [f"--parallelism={args.parallelism}"]
    if args.small:
        passed.append("--small")
    passed.extend(f"--flink_option={o}" for o in args.flink_option or ())
    local = [f"--flink_master={args.flink_master}", f"--environment_type={args.environment_type}"]
    if args.environment_config:
        local.append(f"--environment_config={args.environment_config}")
    if args.job_endpoint:
        local.append(f"--job_endpoint={args.job_endpoint}")
    cluster = None
    try:
        if any(r in CLUSTER_RUNNERS for r in runners):
            started = time.perf_counter()
            cluster = _RunningCluster(args.parallelism).start()
            print(f"# standalone cluster and job server up in "
                  f"{time.perf_counter() - started:.1f} s (not counted)", flush=True)
        for runner in runners:
            print(f"# {runner}: {_describe(runner, args)}", flush=True)
            if runner in CLUSTER_RUNNERS:
                cluster.warm_up(runner)
        _run_all(cases, runners, passed, local, cluster, args)
    finally:
        if cluster is not None:
            cluster.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} (1 min), {load[1]:.1f} (5 min); machine: "
          f"{platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, apache-beam {beam.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")


def _run_all(cases, runners, passed, local, cluster, args) -> None:
    print(f"{'case':12s} {'runner':16s} {'items':>9s} {'seconds':>8s} {'per second':>11s} "
          f"{'per CPU-s':>10s} {'start s':>8s} {'after start/s':>14s}  contents")
    for case in cases:
        for runner in runners:
            if case in ("write", "pardo", "upsert-table") and runner == "flink-streaming":
                continue
            if case in STREAM_CASES and runner not in ("direct", "flink-streaming"):
                continue
            where = cluster.args(runner) if runner in CLUSTER_RUNNERS else local
            pool_before = cluster.workers_started() if runner == "flink-cluster-external" else 0
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.flink_bench", "--one", f"--case={case}",
                 f"--runner={runner}", *passed, *where], capture_output=True, text=True)
            line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if done.returncode or not line:
                print(f"{case:12s} {runner:16s} FAILED\n{done.stderr[-3000:]}", flush=True)
                continue
            r = json.loads(line[0][7:])
            if runner == "flink-cluster-external":
                r["workers"] = cluster.workers_started() - pool_before
            print(f"{case:12s} {runner:16s} {r['n']:>9,d} {r['seconds']:>8.1f} "
                  f"{r['per_second']:>11,.0f} {r['per_cpu_second']:>10,.0f} "
                  f"{r['start_seconds']:>8.1f} {r['after_start_per_second']:>14,.0f}  "
                  f"{r['contents'] or '-'}", flush=True)
            _print_phases(r)
            if args.stages:
                _print_stages(r)


if __name__ == "__main__":
    # Through the package, not as __main__: the DoFns defined here then pickle
    # by reference, which workers in other processes (EXTERNAL) can import.
    from benchmarks import flink_bench
    flink_bench.main()
