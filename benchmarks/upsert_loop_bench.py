"""The closed loop (``UpsertToSupertable``) against the open one (``Upsert`` + append).

    python -m benchmarks.upsert_loop_bench            # 200,000 commands, 50,000 keys, 500,000 rows
    python -m benchmarks.upsert_loop_bench --small    # 20,000 commands, 5,000 keys, 50,000 rows

A table of ``rows`` rows (``id`` int64 key, ``value`` int64, ``emb`` 64-d
float32) on a local directory, and a Parquet file of commands over ``keys``
keys (half of them in the table, half new; 5 % deletes; 10 distinct
seconds). Both cases read the same command file on the DirectRunner, each in
its own process (so peak RSS is its own), each on a fresh copy of the table:

- ``loop``: ``UpsertToSupertable`` (prior read back from the table by key,
  one commit with deletion vectors and the frontier);
- ``open``: ``Upsert`` (grouped, no prior) then ``WriteToSupertable`` of the
  insertions, appended to a keyless copy (the open loop neither reads the
  table back nor removes replaced rows).

Only the pipeline is timed (reading the commands included, building the
table not).
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
from beam_upsert import Upsert, UpsertCommand

DIM = 64
SIZES = {"full": (200_000, 50_000, 500_000), "small": (20_000, 5_000, 50_000)}
N_TIMES, DELETE_SHARE = 10, 0.05
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.int64()), ("emb", pa.list_(pa.float32(), DIM))])


def make_data(root: str, commands: int, keys: int, rows: int) -> None:
    """The base tables (keyed and keyless) and the command file, once per root."""
    if os.path.exists(os.path.join(root, "commands.parquet")):
        return
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, DIM)).astype(np.float32)
    base = pa.table({"id": pa.array(np.arange(rows, dtype=np.int64)),
                     "value": pa.array(np.zeros(rows, dtype=np.int64)),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM)})
    for name, key in (("keyed", "id"), ("keyless", None)):
        t = Supertable.create(os.path.join(root, name), SCHEMA, vector_column="emb",
                              primary_key=key)
        t.append(base)
    old = rng.choice(rows, keys // 2, replace=False).astype(np.int64)
    pool = np.concatenate([old, np.arange(rows, rows + keys - len(old), dtype=np.int64)])
    ids = pool[rng.integers(0, len(pool), commands)]
    y = rng.normal(size=(commands, DIM)).astype(np.float32)
    gone = rng.random(commands) < DELETE_SHARE
    # A variable-size list in the file: Parquet readers trip over fixed-size
    # lists under null structs; the table's schema narrows it back.
    emb = pa.ListArray.from_arrays(pa.array(np.arange(commands + 1, dtype=np.int32) * DIM),
                                   pa.array(y.ravel()))
    value = pa.StructArray.from_arrays(
        [pa.array(ids), pa.array(rng.integers(1, 1000, commands)), emb],
        names=SCHEMA.names, mask=pa.array(gone))
    pq.write_table(pa.table({"key": pa.array(ids), "offset": pa.array(np.arange(commands)),
                             "time": pa.array(rng.integers(0, N_TIMES, commands) + 1.0),
                             "value": value}), os.path.join(root, "commands.parquet"),
                   row_group_size=10_000)


def _commands(p, root):
    return (p | "Read" >> beam.io.ReadFromParquet(os.path.join(root, "commands.parquet"))
            | "ToCommand" >> beam.Map(lambda r: TimestampedValue(
                UpsertCommand(r["key"], r["value"], r["offset"]), r["time"])))


def case_loop(root: str, table: str) -> None:
    with beam.Pipeline(options=PipelineOptions()) as p:
        _ = _commands(p, root) | UpsertToSupertable(table)


def case_open(root: str, table: str) -> None:
    with beam.Pipeline(options=PipelineOptions()) as p:
        _ = (_commands(p, root) | Upsert("grouped")
             | "Insertions" >> beam.FlatMap(lambda c: [c.value] if c.diff > 0 else [])
             | WriteToSupertable(table))


def peak_rss_mb() -> float:
    """This process's peak RSS. ``ru_maxrss`` survives ``execve`` on Linux (a
    case process would report its parent's peak, the data build), VmHWM does not."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(name: str, root: str, commands: int) -> None:
    table = os.path.join(root, f"run-{name}")
    shutil.rmtree(table, ignore_errors=True)
    shutil.copytree(os.path.join(root, "keyed" if name == "loop" else "keyless"), table)
    before = Supertable.open(table).count_rows()
    t0 = time.perf_counter()
    (case_loop if name == "loop" else case_open)(root, table)
    elapsed = time.perf_counter() - t0
    t = Supertable.open(table)
    peak_mb = peak_rss_mb()
    print("RESULT " + json.dumps({"case": name, "commands": commands, "seconds": elapsed,
                                  "per_second": commands / elapsed, "peak_rss_mb": peak_mb,
                                  "rows_before": before, "rows_after": t.count_rows(),
                                  "commits": t.version - Supertable.open(
                                      os.path.join(root, "keyed")).version}))
    shutil.rmtree(table, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run (a tenth of the size)")
    parser.add_argument("--case", choices=("loop", "open"))
    parser.add_argument("--root", default=None,
                        help="where the data lives (default: a folder under the temp dir)")
    args = parser.parse_args(argv)
    size = "small" if args.small else "full"
    commands, keys, rows = SIZES[size]
    root = args.root or os.path.join(tempfile.gettempdir(), f"upsert_loop_bench_{size}")
    os.makedirs(root, exist_ok=True)
    make_data(root, commands, keys, rows)
    if args.case:
        run_case(args.case, root, commands)
        return
    results = {}
    for name in ("open", "loop"):
        cmd = [sys.executable, "-m", "benchmarks.upsert_loop_bench", "--case", name,
               "--root", root] + (["--small"] if args.small else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not line:
            print(f"{name}: FAILED\n{done.stderr[-3000:]}")
            continue
        r = results[name] = json.loads(line[0][7:])
        print(f"{name:5s} {r['commands']:>9,d} commands  {r['seconds']:7.1f} s  "
              f"{r['per_second']:>9,.0f} commands/s  peak {r['peak_rss_mb']:,.0f} MB  "
              f"rows {r['rows_before']:,} -> {r['rows_after']:,}", flush=True)
    if len(results) == 2:
        print(f"loop / open time: {results['loop']['seconds'] / results['open']['seconds']:.2f}x "
              f"(goal < 2x); peak RSS loop / open: "
              f"{results['loop']['peak_rss_mb'] / results['open']['peak_rss_mb']:.2f}x")
    print(f"{commands:,} commands over {keys:,} keys into a {rows:,}-row table ({DIM}-d float32); "
          f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, apache-beam {beam.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
