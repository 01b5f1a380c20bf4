"""Upsert and WriteToSupertable on Flink against the DirectRunner, same run.

    python -m benchmarks.flink_bench                 # every case, both runners
    python -m benchmarks.flink_bench --small         # a tenth of the input
    python -m benchmarks.flink_bench --case stateful --runner flink-streaming
    python -m benchmarks.flink_bench --environment_type=EXTERNAL \\
        --environment_config=localhost:50000 --flink_master=localhost:8081

Run it in the Flink environment (apache-beam matching the job server, see
pipelines/flink.py); it is not part of any test suite. Every (case, runner)
runs in its own process and reads its input from files under
benchmarks/data/ (the upsert benchmark's commands and snapshot, and a
Parquet file of vector rows), so job start is included in each figure, as a
user sees it. Cases:

* ``pardo``: read and parse the commands, one plain ParDo (the floor).
* ``grouped`` / ``stateful``: ``Upsert(flavor, prior=snapshot)`` over the
  commands (200,000 over 50,000 keys, a 25,000-key snapshot).
* ``write``: ``WriteToSupertable`` of vector + text rows (rows/s).
* ``upsert-table``: the closed loop, ``UpsertToSupertable`` (grouped,
  bounded) of the same commands as rows ``{key, value}`` into a keyed table
  holding the 25,000-key snapshot (built before the clock starts).

The ``write`` and ``upsert-table`` lines end with an order-free digest of
the table's user columns afterwards: equal digests on both runners mean
identical table contents.

Each line also gives the job start (seconds from submitting the pipeline
to its first bundle: on Flink ``[local]`` the job server's JVM and the
embedded cluster starting) and items per second after it.
* ``upsert-table-stream``: the same commands as an unbounded stream (the
  file's PCollection declared unbounded) into ``UpsertToSupertable`` on an
  empty keyed table (``key``, ``value``): the stateful flavor per state
  shard and one commit per second of event time (10 commits). Runs on
  ``direct`` and ``flink-streaming`` only.

Besides items per wall-clock second, each line gives items per CPU-second
of the submitting process, where the DirectRunner and LOOPBACK workers run:
on a shared machine that is the per-worker rate (EXTERNAL workers run in
their own processes, so that column then counts only the submitter).

Runners: ``direct`` (the DirectRunner), ``flink`` (batch) and
``flink-streaming`` (``--streaming``; Upsert cases only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from beam_supertable.digest import row_digest
from beam_upsert import UpsertCommand
from benchmarks import upsert_bench

DATA = upsert_bench.DATA
SMALL_COMMANDS, SMALL_PRIOR = 20_000, 2_500
WRITE_ROWS, SMALL_WRITE_ROWS, DIM = 50_000, 5_000, 64
CASES = ("pardo", "grouped", "stateful", "write", "upsert-table", "upsert-table-stream")
TABLE_SCHEMA = pa.schema([pa.field("key", pa.string(), nullable=False), ("value", pa.int64())])
STREAM_CASES = ("upsert-table-stream",)   # unbounded input: no Flink batch run
RUNNERS = ("direct", "flink", "flink-streaming")


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
    from pipelines import flink
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
    argv = ["--runner=FlinkRunner", f"--flink_master={args.flink_master}",
            f"--parallelism={args.parallelism}", *extra]
    return flink.fill_defaults(PipelineOptions(argv), argv)


def run_case(case: str, runner: str, args) -> dict:
    """Runs one case on one runner in this process; returns its figures."""
    commands, prior, n = _files(args.small)
    options = _options(runner, args)
    work = tempfile.mkdtemp(prefix="flink-bench-")
    uri, contents = os.path.join(work, "table"), None
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
                    out = cmds | Upsert(case, prior=snapshot)
                _ = out | beam.ParDo(_Drain())
        seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
        with open(started) as f:
            start = float(f.read()) - wall0
        if case in ("write", "upsert-table", "upsert-table-stream"):
            contents = _contents(uri)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"case": case, "runner": runner, "n": n, "seconds": seconds, "per_second": n / seconds,
            "cpu_seconds": cpu, "per_cpu_second": n / cpu, "contents": contents,
            "start_seconds": start, "after_start_per_second": n / (seconds - start)}


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
    return (f"Flink {mode}, {args.environment_type}, parallelism {args.parallelism}, "
            f"master {args.flink_master}")


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
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases, runners = args.case or list(CASES), args.runner or list(RUNNERS)
    if args.one:
        print("RESULT " + json.dumps(run_case(cases[0], runners[0], args)), flush=True)
        return
    passed = [f"--parallelism={args.parallelism}", f"--flink_master={args.flink_master}",
              f"--environment_type={args.environment_type}"]
    if args.environment_config:
        passed.append(f"--environment_config={args.environment_config}")
    if args.small:
        passed.append("--small")
    passed.extend(f"--flink_option={o}" for o in args.flink_option or ())
    for runner in runners:
        print(f"# {runner}: {_describe(runner, args)}", flush=True)
    print(f"{'case':12s} {'runner':16s} {'items':>9s} {'seconds':>8s} {'per second':>11s} "
          f"{'per CPU-s':>10s} {'start s':>8s} {'after start/s':>14s}  contents")
    for case in cases:
        for runner in runners:
            if case in ("write", "pardo", "upsert-table") and runner == "flink-streaming":
                continue
            if case in STREAM_CASES and runner == "flink":
                continue
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.flink_bench", "--one", f"--case={case}",
                 f"--runner={runner}", *passed], capture_output=True, text=True)
            line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if done.returncode or not line:
                print(f"{case:12s} {runner:16s} FAILED\n{done.stderr[-3000:]}", flush=True)
                continue
            r = json.loads(line[0][7:])
            print(f"{case:12s} {runner:16s} {r['n']:>9,d} {r['seconds']:>8.1f} "
                  f"{r['per_second']:>11,.0f} {r['per_cpu_second']:>10,.0f} "
                  f"{r['start_seconds']:>8.1f} {r['after_start_per_second']:>14,.0f}  "
                  f"{r['contents'] or '-'}", flush=True)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, apache-beam {beam.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
