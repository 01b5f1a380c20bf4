"""WriteToSupertable / ReadFromSupertable against Beam's Parquet IO, same rows, same run.

    python -m benchmarks.transforms_bench [--rows N] [--rounds R] [--only write|read]

Input: 200,000 rows by default (128-d float32 vector + a short text) in a Parquet file
under benchmarks/data/, read by the pipeline itself (never beam.Create).
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import tempfile
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable import ReadFromSupertable, Supertable, WriteToSupertable

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
N, DIM = 200_000, 128
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WORDS = "alpha beta gamma delta river stone cloud forest ember frost lumen quartz".split()


def source(n: int = N) -> str:
    name = "rows_200k.parquet" if n == N else f"rows_{n}.parquet"
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        os.makedirs(DATA, exist_ok=True)
        rng = np.random.default_rng(0)
        centers = rng.normal(size=(1000, DIM)).astype(np.float32)
        x = centers[rng.integers(0, 1000, n)] + rng.normal(size=(n, DIM)).astype(np.float32)
        table = pa.table({
            "n": np.arange(n),
            "body": [" ".join(rng.choice(WORDS, 6)) for _ in range(n)],
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM),
        })
        pq.write_table(table, path, row_group_size=10_000)
    return path


def timed(build) -> float:
    t0 = time.perf_counter()
    with beam.Pipeline() as p:
        build(p)
    return time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=N, help="input rows (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds; the best is kept (default %(default)s, env BENCH_ROUNDS)")
    parser.add_argument("--only", choices=("write", "read"),
                        help="run only the write or only the read pipelines")
    args = parser.parse_args(argv)
    n, rounds = args.rows, args.rounds
    src = source(n)
    schema = pq.read_schema(src)
    work = tempfile.mkdtemp(prefix="transforms-bench-")

    def cases(i):
        # Writes go to fresh locations each round; reads use round 0's output.
        return {
            "write_parquet_rows": lambda p: p | "R" >> beam.io.ReadFromParquet(src)
            | beam.io.WriteToParquet(f"{work}/{i}/pq_rows/part", schema),
            "write_supertable_rows": lambda p: p | "R" >> beam.io.ReadFromParquet(src)
            | WriteToSupertable(f"{work}/{i}/st_rows", schema=schema, vector_column="emb",
                                fts_columns=["body"]),
            "write_parquet_batches": lambda p: p | "R" >> beam.io.ReadFromParquetBatched(src)
            | beam.io.WriteToParquetBatched(f"{work}/{i}/pq_batches/part", schema),
            "write_supertable_batches": lambda p: p | "R" >> beam.io.ReadFromParquetBatched(src)
            | WriteToSupertable(f"{work}/{i}/st_batches", schema=schema, vector_column="emb",
                                fts_columns=["body"]),
            "read_parquet_rows": lambda p: p | beam.io.ReadFromParquet(f"{work}/0/pq_rows/part*"),
            "read_supertable_rows": lambda p: p | ReadFromSupertable(f"{work}/0/st_rows"),
            "read_parquet_batches": lambda p: p | beam.io.ReadFromParquetBatched(
                f"{work}/0/pq_rows/part*"),
            "read_supertable_batches": lambda p: p | ReadFromSupertable(
                f"{work}/0/st_rows", as_batches=True),
        }

    # Best of ROUNDS, the rounds interleaving both sides, so that a burst of
    # load from elsewhere on this shared machine hits one round, not one side.
    results = {}
    for i in range(rounds):
        for name, build in cases(i).items():
            if args.only and not name.startswith(args.only):
                if i == 0 and name in ("write_parquet_rows", "write_supertable_rows"):
                    timed(build)   # what the reads read, untimed
                continue
            seconds = timed(build)
            results[name] = min(results.get(name, seconds), seconds)
        if i == 0:
            assert Supertable.open(f"{work}/0/st_rows").count_rows() == n
    pq_files = glob.glob(f"{work}/0/pq_rows/part*")
    for name, seconds in results.items():
        print(f"{name:26s} {seconds:6.1f} s  {n / seconds:>9,.0f} rows/s", flush=True)
    for kind in ("rows", "batches"):
        for op in ("write", "read"):
            if f"{op}_parquet_{kind}" in results:
                print(f"{op} {kind}: supertable/parquet "
                      f"{results[f'{op}_parquet_{kind}'] / results[f'{op}_supertable_{kind}']:.2f}x")
    print(f"({len(pq_files)} Parquet shard(s) written by WriteToParquet; best of {rounds} rounds, {n:,} rows)")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, apache-beam {beam.__version__}, DirectRunner, "
          f"{time.strftime('%Y-%m-%d')}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
