"""The compiled kernels: what they add to a fresh worker's first search, and what they save.

    python -m benchmarks.kernels_bench              # both
    python -m benchmarks.kernels_bench --only jit   # or: scan, first-write

A fresh process (a new worker) opens a 20,000 x 64 table and runs a batch of
64 queries, then the same batch again. Measured, best of 3, each in a new
process:

- ``jit cold``: importing numba and compiling the search kernels with an
  empty JIT cache folder (``NUMBA_CACHE_DIR``): the worst a worker pays;
- ``jit warm``: the same with the cache folder a previous process filled
  (loading the machine code): what every later worker on the machine pays;
- the first search's time against the second's, in both cases.

Wall and CPU seconds: on a shared, loaded machine the wall time waits for a core.

``first-write``: a fresh process creates a 20,000 x 128 table and appends to it
(training its grid, digesting its rows), then a second table the same way; the
first write's extra time over the second is what a fresh worker pays for first
use (imports, compiling), with an empty JIT cache folder and with a filled one.

``scan``: a 1,000-query batch on a warm 50,000 x 128 table (well-separated
clusters, as ``search_bench``'s (b)), with the compiled cell scan and with the
numpy path it replaces (``search.COMPILED_SCAN``), alternating, best of 8 each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

ROWS, DIM, QUERIES, REPEAT = 20_000, 64, 64, 3

CHILD = r"""
import json, sys, time
import numpy as np
from beam_supertable import Supertable
t = Supertable.open(sys.argv[1])
q = np.load(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
from beam_supertable.vector import kernels
kernels.scan_topk(q[:1, :2], np.zeros((2, 4), np.float32), np.array([0]), np.array([4]),
                  np.array([0, 1]), np.array([0]), 2)
jit, cpu = time.perf_counter() - t0, time.process_time() - c0
t0 = time.perf_counter()
t.search(vector=q, k=10, columns=[])
first = time.perf_counter() - t0
t0 = time.perf_counter()
t.search(vector=q, k=10, columns=[])
second = time.perf_counter() - t0
print(json.dumps({"jit": jit, "cpu": cpu, "first": first, "second": second}))
"""


WRITER = r"""
import json, sys, tempfile, time
import numpy as np, pyarrow as pa
from beam_supertable import Supertable
x = np.random.default_rng(0).normal(size=(20_000, 128)).astype(np.float32)
data = pa.table({"id": pa.array(np.arange(len(x))),
                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 128)})
d = tempfile.mkdtemp()
took = []
for name in ("t", "u"):
    t0 = time.perf_counter()
    Supertable.create(f"{d}/{name}", data.schema, vector_column="emb", metric="l2").append(data)
    took.append(time.perf_counter() - t0)
print(json.dumps({"first": took[0], "second": took[1]}))
"""


def first_write() -> None:
    with tempfile.TemporaryDirectory() as d:
        for i in range(REPEAT):
            env = {**os.environ, "NUMBA_CACHE_DIR": f"{d}/jit{i}"}
            for state in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-c", WRITER], env=env, check=True,
                                     capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                print(f"first write, JIT cache {state}: {r['first']:.2f} s, second "
                      f"{r['second']:.2f} s: +{r['first'] - r['second']:.2f} s", flush=True)


def _child(table: str, queries: str, cache: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", CHILD, table, queries], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def scan() -> None:
    from beam_supertable import Supertable
    from beam_supertable.vector import search as vsearch
    from benchmarks.search_bench import clustered

    x, q = clustered(50_000, 1_000, 250, 5.0)
    with tempfile.TemporaryDirectory() as d:
        data = pa.table({"id": pa.array(np.arange(len(x))),
                         "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])})
        Supertable.create(f"{d}/t", data.schema, vector_column="emb", metric="l2").append(data)
        t = Supertable.open(f"{d}/t")
        for _ in range(3):
            t.search(vector=q, k=10, columns=[])
        best = {True: float("inf"), False: float("inf")}
        try:
            for _ in range(8):
                for flag in (True, False):
                    vsearch.COMPILED_SCAN = flag
                    t0 = time.perf_counter()
                    t.search(vector=q, k=10, columns=[])
                    best[flag] = min(best[flag], time.perf_counter() - t0)
        finally:
            vsearch.COMPILED_SCAN = True
    print(f"scan: compiled {len(q) / best[True]:,.0f} q/s, numpy {len(q) / best[False]:,.0f} q/s "
          f"({best[False] / best[True]:.2f}x)")


def jit() -> None:
    from beam_supertable import Supertable

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        data = pa.table({"id": pa.array(np.arange(ROWS)),
                         "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM)})
        t = Supertable.create(f"{d}/t", data.schema, vector_column="emb", metric="l2")
        t.append(data)
        np.save(f"{d}/q.npy", rng.normal(size=(QUERIES, DIM)).astype(np.float32))
        cold, warm = [], []
        for i in range(REPEAT):
            cache = f"{d}/jit{i}"
            cold.append(_child(f"{d}/t", f"{d}/q.npy", cache))
            warm.append(_child(f"{d}/t", f"{d}/q.npy", cache))
    for name, runs in (("cold", cold), ("warm", warm)):
        best = min(runs, key=lambda r: r["jit"])
        each = ", ".join(f"{r['jit']:.2f}" for r in runs)
        print(f"jit {name}: numba import + kernels {min(r['jit'] for r in runs):.2f} s "
              f"(of 3: {each}; CPU {best['cpu']:.2f} s); "
              f"then first search "
              f"{best['first'] * 1e3:.0f} ms, second {best['second'] * 1e3:.0f} ms")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("jit", "scan", "first-write"))
    args = parser.parse_args()
    if args.only in (None, "jit"):
        jit()
    if args.only in (None, "scan"):
        scan()
    if args.only in (None, "first-write"):
        first_write()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
