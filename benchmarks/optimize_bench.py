"""What ``Supertable.optimize`` buys: search before and after, and what it costs.

    python -m benchmarks.optimize_bench            # 200 commits x 1,000 rows, 128-d
    python -m benchmarks.optimize_bench --small    # 40 commits x 500 rows, 64-d (a minute)

Two tables, both grown by appends from one small first commit (so the grid
has the cells the first commit sized, about sqrt(1,000) = 32):

- "streamed, 20 % deleted": then 20 % of the rows are deleted; optimize
  compacts, reclaims the deleted rows and splits the outgrown cells;
- "grown by appends": the same appends without deletes; optimize compacts
  and splits.

For each, before and after ``optimize()`` at default settings: superfiles,
cells, single-query p50 (warm handle), batch queries/s, bytes read per query
(a fresh handle per query, manifest and grid already loaded), recall@10
against brute force over the live rows. The optimize runs in a child process,
so its wall time and peak RSS are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import Supertable

K = 10
SINGLE_QUERIES = 50
COLD_QUERIES = 20


def data(n, dim, clusters, queries, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32)
    x = centers[rng.integers(0, clusters, n)] + rng.normal(size=(n, dim)).astype(np.float32)
    q = centers[rng.integers(0, clusters, queries)] + rng.normal(size=(queries, dim)).astype(np.float32)
    return x.astype(np.float32), q.astype(np.float32)


def build(uri, x, commits, rows):
    schema = pa.schema([("n", pa.int64()), ("emb", pa.list_(pa.float32(), x.shape[1]))])
    t = Supertable.create(uri, schema, vector_column="emb")
    for c in range(commits):
        part = x[c * rows:(c + 1) * rows]
        t.append(pa.table({"n": np.arange(c * rows, c * rows + len(part)),
                           "emb": pa.FixedSizeListArray.from_arrays(pa.array(part.ravel()),
                                                                    x.shape[1])}))
    return t


def truth(x, live, q):
    xs = x[live]
    xn = (xs * xs).sum(1)
    out = np.empty((len(q), K), np.int64)
    for s in range(0, len(q), 256):
        d = xn[None, :] - 2 * q[s:s + 256] @ xs.T
        out[s:s + 256] = np.argsort(d, axis=1)[:, :K]
    return live[out]       # row numbers (= column n)


def measure(uri, q, want):
    t = Supertable.open(uri)
    entries = t.superfiles()
    cells = {c for e in entries for c in e.get("cells", ())}
    got = t.search(vector=q, k=K, columns=["n"])
    hits = 0
    for qi in range(len(q)):
        mine = set(got.filter(pc.field("_query") == qi)["n"].to_pylist())
        hits += len(mine & set(want[qi].tolist()))
    recall = hits / (K * len(q))
    t.search(vector=q[0], k=K)                          # warm
    lat = []
    for i in range(SINGLE_QUERIES):
        t0 = time.perf_counter()
        t.search(vector=q[i], k=K)
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    t.search(vector=q, k=K)
    qps = len(q) / (time.perf_counter() - t0)
    cold = []
    for i in range(COLD_QUERIES):
        fresh = Supertable.open(uri)
        fresh.grid()
        fresh.superfiles()
        before = fresh.io.bytes
        fresh.search(vector=q[i], k=K)
        cold.append(fresh.io.bytes - before)
    return {"superfiles": len(entries), "cells": int(t.properties["grid"]["n_cells"]),
            "cells_used": len(cells), "rows": t.count_rows(),
            "p50_ms": round(float(np.median(lat)) * 1000, 2), "batch_qps": round(qps, 1),
            "bytes_per_query": int(np.median(cold)), "recall_at_10": round(recall, 4)}


def optimize_in_child(uri):
    """Runs optimize in a fresh interpreter; returns (seconds, peak RSS MiB, version, plan)."""
    code = ("import json, resource, sys, time\n"
            "from beam_supertable import Supertable\n"
            "t = Supertable.open(sys.argv[1])\n"
            "plan = t.optimize(dry_run=True).to_dict(); plan.pop('groups')\n"
            "t0 = time.perf_counter(); v = t.optimize(); s = time.perf_counter() - t0\n"
            "print(json.dumps({'seconds': s, 'version': v, 'plan': plan, 'rss_mib': "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n")
    out = subprocess.run([sys.executable, "-c", code, uri], check=True, capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="40 commits x 500 rows, 64-d")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    commits, rows, dim, clusters, queries = (40, 500, 64, 200, 200) if args.small else \
        (200, 1_000, 128, 1_000, 1_000)
    n = commits * rows
    x, q = data(n, dim, clusters, queries)
    root = tempfile.mkdtemp(prefix="optimize-bench-")
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                      f"{platform.python_version()}",
           "table": f"{commits} commits x {rows} rows, {dim}-d, {clusters} clusters"}
    try:
        grown = os.path.join(root, "grown")
        t0 = time.perf_counter()
        build(grown, x, commits, rows)
        out["build_seconds"] = round(time.perf_counter() - t0, 1)
        deleted = os.path.join(root, "deleted")
        shutil.copytree(grown, deleted)
        doomed = np.random.default_rng(1).choice(n, n // 5, replace=False)
        Supertable.open(deleted).delete(pc.field("n").isin(pa.array(np.sort(doomed))))
        live = np.setdiff1d(np.arange(n), doomed)
        for name, uri, rows_live in (("streamed, 20% deleted", deleted, live),
                                     ("grown by appends", grown, np.arange(n))):
            want = truth(x, rows_live, q)
            before = measure(uri, q, want)
            run = optimize_in_child(uri)
            after = measure(uri, q, want)
            out[name] = {"before": before, "after": after,
                         "optimize": {"seconds": round(run["seconds"], 1),
                                      "peak_rss_mib": round(run["rss_mib"]),
                                      "plan": run["plan"]}}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['table']} ({out['machine']}); build {out['build_seconds']} s")
    cols = ["superfiles", "cells", "rows", "p50_ms", "batch_qps", "bytes_per_query",
            "recall_at_10"]
    for name in ("streamed, 20% deleted", "grown by appends"):
        r = out[name]
        print(f"\n{name}: optimize {r['optimize']['seconds']} s, peak RSS "
              f"{r['optimize']['peak_rss_mib']} MiB, rewrote "
              f"{r['optimize']['plan']['superfiles_to_rewrite']} superfiles, reclaimed "
              f"{r['optimize']['plan']['deleted_rows_to_reclaim']} rows, split "
              f"{r['optimize']['plan']['cells_to_split']} cells")
        print("  " + " ".join(f"{c:>15}" for c in ["", *cols]))
        for when in ("before", "after"):
            print("  " + " ".join(f"{v:>15}" for v in [when, *(r[when][c] for c in cols)]))


if __name__ == "__main__":
    main()
