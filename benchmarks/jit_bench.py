"""What the compiled kernels add to a fresh worker's first search.

    python -m benchmarks.jit_bench

A fresh process (a new worker) opens a 20,000 x 64 table and runs a batch of
64 queries, then the same batch again. Measured, best of 3, each in a new
process:

- ``jit cold``: importing numba and compiling the search kernels with an
  empty JIT cache folder (``NUMBA_CACHE_DIR``): the worst a worker pays;
- ``jit warm``: the same with the cache folder a previous process filled
  (loading the machine code): what every later worker on the machine pays;
- the first search's time against the second's, in both cases.

Wall and CPU seconds: on a shared, loaded machine the wall time waits for a core.
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


def _child(table: str, queries: str, cache: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", CHILD, table, queries], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
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
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
