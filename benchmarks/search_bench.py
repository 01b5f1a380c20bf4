"""Supertable search quality and speed on five data shapes, each against baselines in the same run.

    python -m benchmarks.search_bench                  # everything, full sizes (the README's figures)
    python -m benchmarks.search_bench --quick          # smaller sizes, for iterating
    python -m benchmarks.search_bench --only shapes    # or: text, cold, ingest
    python -m benchmarks.search_bench --only shapes --shapes a,b
    python -m benchmarks.search_bench --only shapes --plot   # + recall/q/s curves, a chart

Shapes (recall@10 of held-out queries against exact brute force):

    (a) overlapping Gaussian clusters: 200,000 x 128, 1,000 centres, unit noise
    (b) well-separated clusters: the same with the centres scaled 5x
    (c) LSA embeddings (TF-IDF + TruncatedSVD to 128 dims, cosine) of the
        docstring paragraphs of Python's standard library (read from the
        installed sources: nothing is downloaded)
    (d) scikit-learn's digits (1,797 x 64)
    (e) skewed: 200,000 x 128, 1,000 Zipf-sized clusters (a few hold most
        rows), a power-law spectrum (dimension j scaled by j^-0.6) and a
        random rotation, so no axis is special

For each: recall at default settings (the table's calibrated probe law),
batch q/s against numpy brute force and faiss ``IndexIVFScalarQuantizer``
(SQ8, 1,024 lists, or N/39 on small sets, at the smallest nprobe reaching
recall 0.95; ``IndexIVFFlat`` where SQ8 never reaches it), and single-query p50/p99 on a warm handle. Also: a cold query
on an S3 server (round trips and bytes), BM25 query latency against bm25s,
and ingest against LanceDB.

Needs the benchmark extras: pip install -e .[bench] (faiss-cpu, bm25s, lancedb).
Timings are the best of several runs: a shared machine is noisy.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa

from beam_supertable import Supertable
from beam_supertable.fts.tokenize import tokenize
from beam_supertable.vector import calibrate
from beam_supertable.vector.metric import prepare

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
K = 10
TARGET = 0.95
FAISS_LISTS = 1_024
FAISS_MIN_PER_LIST = 39       # faiss wants at least this many training points per list
WORDS = ("alpha beta gamma delta river stone cloud forest ember frost lumen quartz "
         "violet amber orbit pixel signal vector cipher harbor meadow summit").split()

FULL = {"n": 200_000, "clusters": 1_000, "queries": 1_000, "single": 1_000, "repeat": 7,
        "cold_n": 50_000}
QUICK = {"n": 50_000, "clusters": 250, "queries": 500, "single": 300, "repeat": 3,
         "cold_n": 20_000}


# -- data shapes --------------------------------------------------------------
def clustered(n, queries, clusters, scale, dim=128, seed=0):
    """Rows and held-out queries around ``clusters`` Gaussian centres (scaled)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32) * scale
    x = centers[rng.integers(0, clusters, n)] + rng.normal(size=(n, dim)).astype(np.float32)
    q = centers[rng.integers(0, clusters, queries)] + rng.normal(size=(queries, dim)).astype(np.float32)
    return x.astype(np.float32), q.astype(np.float32)


def skewed(n, queries, clusters, dim=128, seed=0):
    """Zipf-sized clusters under a power-law spectrum, randomly rotated.

    Real embeddings are not isotropic blobs of equal size: a few topics hold
    most rows and a few directions most of the variance. Queries follow the
    rows' distribution.
    """
    rng = np.random.default_rng(seed)
    sizes = 1.0 / np.arange(1, clusters + 1) ** 1.1
    sizes /= sizes.sum()
    spectrum = (np.arange(1, dim + 1) ** -0.6).astype(np.float32)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32) * 3.0
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    rotation = rotation.astype(np.float32)

    def draw(m):
        own = rng.choice(clusters, m, p=sizes)
        z = centers[own] + rng.normal(size=(m, dim)).astype(np.float32)
        return ((z * spectrum) @ rotation).astype(np.float32)
    return draw(n), draw(queries)


def stdlib_paragraphs():
    """Docstring paragraphs (>= 40 characters) of the installed standard library's sources.

    Parsed with ``ast`` (no module is imported) and cached under benchmarks/data/.
    """
    path = os.path.join(DATA, f"stdlib_paragraphs_{sys.version_info[0]}{sys.version_info[1]}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "__pycache__", "idlelib",
                                                      "turtledemo"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(here, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        docs.append(doc)
    out = []
    for doc in dict.fromkeys(docs):
        for para in re.split(r"\n\s*\n", doc):
            para = " ".join(para.split())
            if len(para) >= 40:
                out.append(para)
    out = list(dict.fromkeys(out))
    os.makedirs(DATA, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def lsa(queries, dim=128, seed=0):
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer
    docs = stdlib_paragraphs()
    tfidf = TfidfVectorizer(sublinear_tf=True, min_df=2).fit_transform(docs)
    x = TruncatedSVD(dim, random_state=seed).fit_transform(tfidf).astype(np.float32)
    perm = np.random.default_rng(seed).permutation(len(x))
    return x[perm[queries:]], x[perm[:queries]]


def digits(queries=300, seed=0):
    from sklearn.datasets import load_digits
    x = load_digits().data.astype(np.float32)
    perm = np.random.default_rng(seed).permutation(len(x))
    return x[perm[queries:]], x[perm[:queries]]


def shapes(cfg, which):
    out = []
    if "a" in which:
        out.append(("a", "overlapping clusters", "l2",
                    *clustered(cfg["n"], cfg["queries"], cfg["clusters"], 1.0)))
    if "b" in which:
        out.append(("b", "well-separated clusters (centres x5)", "l2",
                    *clustered(cfg["n"], cfg["queries"], cfg["clusters"], 5.0)))
    if "c" in which:
        out.append(("c", "LSA of stdlib docstring paragraphs", "cosine",
                    *lsa(min(cfg["queries"], 1_000))))
    if "d" in which:
        out.append(("d", "scikit-learn digits", "l2", *digits()))
    if "e" in which:
        out.append(("e", "skewed (Zipf clusters, power-law spectrum, rotated)", "l2",
                    *skewed(cfg["n"], cfg["queries"], cfg["clusters"])))
    return out


# -- measuring ----------------------------------------------------------------
def brute_force(x, q, metric, k=K):
    """numpy exact top-k: one matrix product per 256 queries, then argpartition."""
    xp, qp = prepare(x, metric), prepare(q, metric)
    xn = (xp * xp).sum(1) if metric == "l2" else 0
    out = np.empty((len(q), k), np.int64)
    for s in range(0, len(q), 256):
        d = xn - 2 * qp[s:s + 256] @ xp.T if metric == "l2" else -(qp[s:s + 256] @ xp.T)
        part = np.argpartition(d, k, axis=1)[:, :k]
        out[s:s + 256] = np.take_along_axis(part, np.take_along_axis(d, part, 1).argsort(1), 1)
    return out


def recall(found, truth):
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / K for f, t in zip(found, truth)]))


def table_rows(t):
    rows = t.to_arrow(columns=["_id", "emb"])
    x = np.asarray(rows["emb"].combine_chunks().flatten().to_numpy(), np.float32).reshape(rows.num_rows, -1)
    return rows["_id"].to_numpy(), x


def found_ids(got, n_queries):
    qcol, ids = got["_query"].to_numpy(), got["_id"].to_numpy()
    order = np.argsort(qcol, kind="stable")
    return np.split(ids[order], np.searchsorted(qcol[order], np.arange(1, n_queries)))


def faiss_index(x, q, metric, truth_pos):
    """faiss IVF-SQ8 at the smallest nprobe reaching recall 0.95 (IVF-Flat if SQ8 never does).

    Returns:
        ``(search, nprobe, recall, lists, kind, index)``: ``search()`` runs the query batch.
    """
    import faiss
    xp, qp = prepare(x, metric), prepare(q, metric)
    lists = int(max(1, min(FAISS_LISTS, len(x) // FAISS_MIN_PER_LIST)))
    kind = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    rng = np.random.default_rng(0)
    train = xp[rng.choice(len(xp), min(len(xp), 40 * lists), replace=False)]
    ladder = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, lists)
    for name in ("IVF-SQ8", "IVF-Flat"):
        quantizer = (faiss.IndexFlatL2(x.shape[1]) if metric == "l2"
                     else faiss.IndexFlatIP(x.shape[1]))
        if name == "IVF-SQ8":
            index = faiss.IndexIVFScalarQuantizer(quantizer, x.shape[1], lists,
                                                  faiss.ScalarQuantizer.QT_8bit, kind)
        else:
            index = faiss.IndexIVFFlat(quantizer, x.shape[1], lists, kind)
        index.train(train)
        index.add(xp)
        for nprobe in sorted({p for p in ladder if p <= lists}):
            index.nprobe = nprobe
            rec = recall(index.search(qp, K)[1], truth_pos)
            if rec >= TARGET:
                return (lambda index=index: index.search(qp, K)), nprobe, rec, lists, name, index
    return (lambda index=index: index.search(qp, K)), nprobe, rec, lists, name, index


def interleaved(fns, repeat, min_seconds=2.0, max_rounds=200, block_seconds=0.02):
    """Seconds per call of each function: its best block, the blocks interleaved.

    As ``timeit`` does, each measurement is a block of back-to-back calls
    (as many as take about ``block_seconds``), and a side's figure is its
    best block's mean: batch q/s is a throughput, and a batch served after
    another of the same kind finds its index in the cache. (Timing single
    calls, each right after the other sides' calls had flushed the caches,
    measured every side cold: our 1 ms digits batch ran 30% slower right after
    brute force than back to back, brute force's 5 ms one hardly at all.)
    Blocks of all sides alternate, each round starting one side further on,
    so that load drift hits all alike; at least ``repeat`` rounds, and more
    (up to ``max_rounds``) until ``min_seconds`` have passed.
    """
    names = list(fns)
    per_block = {}
    for name in names:
        t0 = time.perf_counter()
        fns[name]()
        per_block[name] = max(1, int(block_seconds / max(time.perf_counter() - t0, 1e-6)))
    best = {name: float("inf") for name in fns}
    start, rounds = time.perf_counter(), 0
    while rounds < repeat or (time.perf_counter() - start < min_seconds and rounds < max_rounds):
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            fn, n = fns[name], per_block[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / n)
        rounds += 1
    return best


def sweep(cfg, t, index, q, metric, truth, pos, nprobe, faiss_nprobe, cells, lists,
          steps=(0.5, 1, 2, 4)):
    """Recall and batch q/s of both sides at a few multiples of their nprobe for recall 0.95.

    Each side's own breadth is scaled, not one nprobe shared: the grids differ
    (about 2.5 sqrt(rows) cells against faiss's 1,024 lists), so the same
    number of probes is not the same breadth. Each point's q/s is its own
    interleaved pair, as in the table.
    """
    qp = prepare(q, metric)
    points = {"ours": [], "faiss": []}
    for step in steps:
        ours_p = int(min(cells, max(1, round(nprobe * step))))
        faiss_p = int(min(lists, max(1, round(faiss_nprobe * step))))
        got = t.search(vector=q, k=K, columns=[], nprobe=ours_p)
        ours_rec = recall([np.array([pos[int(i)] for i in f]) for f in found_ids(got, len(q))],
                          truth)
        index.nprobe = faiss_p
        faiss_rec = recall(index.search(qp, K)[1], truth)
        best = interleaved({"ours": lambda: t.search(vector=q, k=K, columns=[], nprobe=ours_p),
                            "faiss": lambda: index.search(qp, K)}, cfg["repeat"])
        points["ours"].append((ours_p, ours_rec, len(q) / best["ours"]))
        points["faiss"].append((faiss_p, faiss_rec, len(q) / best["faiss"]))
        print(f"    curve x{step:g}: ours nprobe {ours_p} recall {ours_rec:.3f} "
              f"{len(q) / best['ours']:,.0f} q/s | faiss nprobe {faiss_p} recall {faiss_rec:.3f} "
              f"{len(q) / best['faiss']:,.0f} q/s", flush=True)
    index.nprobe = faiss_nprobe
    return points


def plot_curves(results):
    from benchmarks import plots
    panels = [(f"({r['shape']}) {r['name'].split(' (')[0]}\n{r['rows']:,} x {r['dim']}",
               [(f"{side}{' ' + r['faiss_kind'] if side == 'faiss' else ''}",
                 [rec for _, rec, _ in pts], [qps for _, _, qps in pts])
                for side, pts in r["curve"].items()])
              for r in results if "curve" in r]
    return plots.draw("search-recall-qps", panels, xlabel="recall@10", ylabel="batch q/s",
                      title="Recall against queries/s, nprobe x0.5, 1, 2, 4 of each side's "
                            "0.95 point", ylog=True, size=(9, 5.5), note=plots.machine_note())


def bench_shape(cfg, key, name, metric, x, q, extra_columns, curve=False):
    dim = x.shape[1]
    d = tempfile.mkdtemp(prefix="search-bench-")
    # "n": the one key column a caller needs to use a hit.
    cols = {"n": np.arange(len(x)), "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim)}
    if extra_columns:
        rng = np.random.default_rng(1)
        cols = {"n": cols["n"], "body": [" ".join(rng.choice(WORDS, 6)) for _ in range(len(x))],
                "emb": cols["emb"]}
    data = pa.table(cols)
    t = Supertable.create(f"{d}/t", data.schema, vector_column="emb", metric=metric)
    t0 = time.perf_counter()
    t.append(data)
    ingest = time.perf_counter() - t0
    t = Supertable.open(f"{d}/t")
    law = t.properties[calibrate.LAW_PROPERTY]
    n_cells = t.properties["grid"]["n_cells"]
    nprobe = law["targets"]["0.95"]
    # What the law's measurement cost, against the append that triggered it.
    centroids = t.grid()
    t0 = time.perf_counter()
    calibrate.measure(x, centroids, metric, "bench")
    cal = time.perf_counter() - t0
    ids, xs = table_rows(t)
    pos = {int(i): j for j, i in enumerate(ids)}
    truth = brute_force(xs, q, metric)
    got = t.search(vector=q, k=K, columns=[])
    rec = recall([np.array([pos[int(i)] for i in f]) for f in found_ids(got, len(q))], truth)
    faiss_search, faiss_nprobe, faiss_rec, lists, faiss_kind, index = faiss_index(
        xs, q, metric, truth)
    # Each ratio from its own interleaved pair: brute force on 200,000 rows
    # allocates and frees ~600 MB a call, and the kernel's work after it
    # slowed whichever side ran next (ours to 0.5x faiss's pace, then 0.25x).
    ours = lambda: t.search(vector=q, k=K, columns=[])        # noqa: E731
    vs_faiss = interleaved({"ours": ours, "faiss": faiss_search}, cfg["repeat"])
    vs_brute = interleaved({"ours": ours, "brute": lambda: brute_force(x, q, metric)},
                           cfg["repeat"])
    warm, faiss_qps = vs_faiss["ours"], len(q) / vs_faiss["faiss"]
    keyed = lambda: t.search(vector=q, k=K, columns=["n"])   # noqa: E731
    # Pairs only: in a three-way round faiss's OpenMP threads, still spinning
    # after its block, took the cores from the block after it, and faiss's
    # figure swung by 2x with the order.
    vs_key = interleaved({"ids": ours, "key": keyed}, cfg["repeat"])
    key_faiss = interleaved({"key": keyed, "faiss": faiss_search}, cfg["repeat"])
    lat, lat_rows = [], []
    n_single = min(cfg["single"], len(q))
    for i in range(n_single):
        t0 = time.perf_counter()
        t.search(vector=q[i], k=K, columns=[])
        lat.append(time.perf_counter() - t0)
    for i in range(n_single):
        t0 = time.perf_counter()
        t.search(vector=q[i], k=K)
        lat_rows.append(time.perf_counter() - t0)
    lat_key = []
    for i in range(n_single):
        t0 = time.perf_counter()
        t.search(vector=q[i], k=K, columns=["n"])
        lat_key.append(time.perf_counter() - t0)
    lat, lat_rows, lat_key = (np.array(v) * 1e3 for v in (lat, lat_rows, lat_key))
    qps = len(q) / warm
    out = {
        "shape": key, "name": name, "rows": len(x), "dim": dim, "metric": metric,
        "queries": len(q), "cells": n_cells, "nprobe": nprobe, "recall": rec,
        "qps": qps, "brute_qps": len(q) / vs_brute["brute"],
        "brute_ratio": vs_brute["brute"] / vs_brute["ours"], "qps_vs_brute": len(q) / vs_brute["ours"],
        "faiss_qps": faiss_qps,
        "faiss_nprobe": faiss_nprobe, "faiss_recall": faiss_rec, "faiss_lists": lists,
        "faiss_kind": faiss_kind,
        "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
        "p50_rows": float(np.percentile(lat_rows, 50)), "p99_rows": float(np.percentile(lat_rows, 99)),
        "ingest_s": ingest, "calibrate_s": cal,
        "key_qps": len(q) / key_faiss["key"], "key_cost": vs_key["key"] / vs_key["ids"],
        "key_vs_faiss": key_faiss["faiss"] / key_faiss["key"],
        "p50_key": float(np.percentile(lat_key, 50)), "p99_key": float(np.percentile(lat_key, 99)),
    }
    print(f"({key}) {name}: {len(x):,} x {dim} ({metric}), {len(q):,} held-out queries\n"
          f"    recall@10 {rec:.3f} at default (law: nprobe {nprobe} of {n_cells} cells); "
          f"law measured in {cal:.2f} s ({cal / ingest:.0%} of the {ingest:.1f} s append)\n"
          f"    batch {qps:,.0f} q/s | numpy brute force {out['brute_qps']:,.0f} q/s "
          f"({out['brute_ratio']:.1f}x; ours {out['qps_vs_brute']:,.0f} q/s beside it) "
          f"| faiss {faiss_kind} {lists} lists nprobe {faiss_nprobe} "
          f"(recall {faiss_rec:.3f}) {faiss_qps:,.0f} q/s ({qps / faiss_qps:.2f}x)\n"
          f"    single query p50 {out['p50']:.2f} ms p99 {out['p99']:.2f} ms (_id, _distance); "
          f"with every column p50 {out['p50_rows']:.2f} ms p99 {out['p99_rows']:.2f} ms\n"
          f"    with the key column: batch {out['key_qps']:,.0f} q/s ({out['key_cost']:.2f}x the "
          f"ids-only time; {out['key_vs_faiss']:.2f}x faiss), single p50 {out['p50_key']:.2f} ms "
          f"p99 {out['p99_key']:.2f} ms", flush=True)
    if curve:
        out["curve"] = sweep(cfg, t, index, q, metric, truth, pos, nprobe, faiss_nprobe,
                             n_cells, lists)
    shutil.rmtree(d)
    return out


def bench_shapes(cfg, which, curve=False):
    results = []
    for key, name, metric, x, q in shapes(cfg, which):
        results.append(bench_shape(cfg, key, name, metric, x, q, extra_columns=key in "ab",
                                   curve=curve))
    if results:
        print("\n| shape | rows | recall@10 | nprobe / cells | batch q/s (`_id`, `_distance`) "
              "| x faiss | with key column q/s | key cost | x faiss with key | faiss | "
              "single p50 / p99 | with key p50 / p99 | every column p50 / p99 |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results:
            print(f"| ({r['shape']}) {r['name']} | {r['rows']:,} x {r['dim']} | {r['recall']:.3f} | "
                  f"{r['nprobe']} / {r['cells']} | {r['qps']:,.0f} | {r['qps'] / r['faiss_qps']:.2f}x | "
                  f"{r['key_qps']:,.0f} | {r['key_cost'] - 1:+.0%} | {r['key_vs_faiss']:.2f}x | "
                  f"{r['faiss_kind']} nprobe {r['faiss_nprobe']} of {r['faiss_lists']} | "
                  f"{r['p50']:.2f} / {r['p99']:.2f} ms | {r['p50_key']:.2f} / {r['p99_key']:.2f} ms | "
                  f"{r['p50_rows']:.2f} / {r['p99_rows']:.2f} ms |")
    return results


# -- a cold query on an S3 server -----------------------------------------------
class _Counting:
    """Counts object-store calls (round trips) and bytes, of every handle, while active."""

    CALLS = ("get", "get_range", "exists", "head", "list")

    def __init__(self):
        from beam_supertable.format.store import ObjectStore
        self._cls, self._saved = ObjectStore, {}
        self.calls, self.bytes = {}, 0

    def __enter__(self):
        for name in self.CALLS:
            self._saved[name] = getattr(self._cls, name)
            setattr(self._cls, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(self._cls, name, fn)

    def _wrap(self, name, fn):
        def counted(store, *args, **kwargs):
            out = fn(store, *args, **kwargs)
            self.calls[name] = self.calls.get(name, 0) + 1
            if isinstance(out, (bytes, bytearray)):
                self.bytes += len(out)
            return out
        return counted


def _moto():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    import boto3
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                 region_name="us-east-1").create_bucket(Bucket="bench")
    return proc, {"key": "x", "secret": "x",
                  "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def bench_cold(cfg):
    """One query on a fresh handle of a table on a local S3 server: round trips and bytes."""
    proc, options = _moto()
    try:
        x, q = clustered(cfg["cold_n"], 20, cfg["clusters"], 1.0)
        rng = np.random.default_rng(1)
        data = pa.table({"n": np.arange(len(x)), "body": [" ".join(rng.choice(WORDS, 6)) for _ in range(len(x))],
                         "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])})
        uri = "s3://bench/cold"
        t = Supertable.create(uri, data.schema, vector_column="emb", storage_options=options)
        spent, for_base = [], calibrate.CommitLaw.for_base

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return for_base(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - t0)

        calibrate.CommitLaw.for_base = timed
        try:
            t0 = time.perf_counter()
            t.append(data)
            append_s = time.perf_counter() - t0
        finally:
            calibrate.CommitLaw.for_base = for_base
        print(f"append of {len(x):,} rows to S3 (moto): {append_s:.1f} s, of which the probe law "
              f"{sum(spent):.2f} s ({sum(spent) / append_s:.0%}; the rows are sampled in memory, "
              f"nothing is read back)", flush=True)
        size = sum(e["bytes"] for e in t.superfiles())
        results = []
        for columns, label in (([], "_id, _distance"), (["n"], "the key column n"),
                               (None, "every column")):
            samples = []
            for i in range(5):
                with _Counting() as counter:
                    t0 = time.perf_counter()
                    cold = Supertable.open(uri, storage_options=options)
                    cold.search(vector=q[i], k=K, columns=columns)
                    el = time.perf_counter() - t0
                samples.append((el, sum(counter.calls.values()), counter.bytes, dict(counter.calls)))
            el, calls, nbytes, detail = sorted(samples)[len(samples) // 2]
            results.append((label, el, calls, nbytes, detail))
            print(f"cold query on S3 (moto, {len(x):,} x 128, {len(t.superfiles())} superfiles, "
                  f"{size:,} bytes), open + one query returning {label}: {calls} round trips "
                  f"({', '.join(f'{k} {v}' for k, v in sorted(detail.items()))}), "
                  f"{nbytes:,} bytes ({nbytes / size:.2%} of the table), {el * 1e3:.0f} ms "
                  f"(median of 5 fresh handles)", flush=True)
        return results
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- text -------------------------------------------------------------------------
def bench_text(cfg):
    import bm25s
    docs = stdlib_paragraphs()
    rng = np.random.default_rng(0)
    tokens = [tokenize(doc) for doc in docs]
    queries = []
    for i in rng.choice(len(docs), 300, replace=False):
        words = [w for w in tokens[i] if len(w) > 3]
        if len(words) >= 2:
            queries.append(" ".join(rng.choice(words, min(3, len(words)), replace=False)))
    d = tempfile.mkdtemp(prefix="search-bench-")
    t = Supertable.create(f"{d}/docs", pa.schema([("n", pa.int64()), ("doc", pa.string())]),
                          fts_columns=["doc"], text_analysis="none")   # bm25s's tokens
    for chunk in np.array_split(np.arange(len(docs)), 4):  # four superfiles
        t.append(pa.table({"n": chunk, "doc": [docs[i] for i in chunk]}))
    t = Supertable.open(f"{d}/docs")
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retriever.index(tokens, show_progress=False)
    for qq in queries[:20]:  # warm both
        t.search(text=qq, k=K)
        retriever.retrieve([tokenize(qq)], k=K, show_progress=False)
    ours, ids_only, theirs, agree, tie_agree, total = [], [], [], 0, 0, 0
    for qq in queries:
        t0 = time.perf_counter()
        t.search(text=qq, k=K, columns=[])
        ids_only.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = t.search(text=qq, k=K)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        res, scores = retriever.retrieve([tokenize(qq)], k=K, show_progress=False)
        theirs.append(time.perf_counter() - t0)
        mine, my_scores = got["n"].to_pylist(), got["_score"].to_pylist()
        kept = [(i, s) for i, s in zip(res[0].tolist(), scores[0].tolist()) if s > 0]
        for p, (i, s) in enumerate(kept):
            total += 1
            if p < len(mine) and mine[p] == i:
                agree += 1
                tie_agree += 1
            elif p < len(mine) and abs(my_scores[p] / 2.2 - s) <= 1e-4 * max(1, s):
                tie_agree += 1  # a different row with the same score: a tie
    ours, ids_only, theirs = (np.array(v) * 1e3 for v in (ours, ids_only, theirs))
    print(f"text: {len(docs):,} stdlib docstring paragraphs in 4 superfiles, {len(queries)} queries "
          f"(3 words, OR), k=10, warm handle:\n"
          f"    supertable BM25 returning _id, _score: p50 {np.percentile(ids_only, 50):.2f} ms "
          f"p99 {np.percentile(ids_only, 99):.2f} ms; returning the rows: p50 "
          f"{np.percentile(ours, 50):.2f} ms p99 {np.percentile(ours, 99):.2f} ms\n"
          f"    bm25s (lucene, k1=1.2, b=0.75, same tokens; retrieve, document numbers only): p50 "
          f"{np.percentile(theirs, 50):.2f} ms p99 {np.percentile(theirs, 99):.2f} ms "
          f"(ratio of p50s, ids: {np.percentile(ids_only, 50) / np.percentile(theirs, 50):.2f}x)\n"
          f"    top-10 positions equal to bm25s {agree / total:.1%}, counting equal-score ties "
          f"{tie_agree / total:.1%}", flush=True)
    shutil.rmtree(d)


# -- ingest -----------------------------------------------------------------------
def bench_ingest(cfg):
    x, _ = clustered(cfg["n"], 1, cfg["clusters"], 1.0)
    rng = np.random.default_rng(0)
    data = pa.table({"body": [" ".join(rng.choice(WORDS, 6)) for _ in range(len(x))],
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])})
    d = tempfile.mkdtemp(prefix="search-bench-")
    t0 = time.perf_counter()
    t = Supertable.create(f"{d}/t", data.schema, vector_column="emb", fts_columns=["body"])
    t.append(data)
    ingest = time.perf_counter() - t0
    print(f"ingest: append of {len(x):,} rows ({x.shape[1]}-d + 6-word text, probe law "
          f"included): {ingest:.1f} s, {len(x) / ingest:,.0f} rows/s "
          f"({len(t.superfiles())} superfiles)", flush=True)
    shutil.rmtree(d)
    try:
        import lancedb
    except ImportError:
        print("  lancedb not installed: pip install -e .[bench]")
        return
    d = tempfile.mkdtemp(prefix="search-bench-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        db = lancedb.connect(d)
        table = db.create_table("t", data=data)
        table.create_index(metric="l2", vector_column_name="emb",
                           num_partitions=int(round(np.sqrt(len(data)))), num_sub_vectors=16)
        table.create_fts_index("body", use_tantivy=False)
        lance = time.perf_counter() - t0
    shutil.rmtree(d)
    print(f"  LanceDB write + IVF_PQ + FTS index: {lance:.1f} s, {len(x) / lance:,.0f} rows/s; "
          f"ratio supertable/LanceDB {lance / ingest:.2f}x", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["shapes", "text", "cold", "ingest"])
    parser.add_argument("--shapes", default="a,b,c,d,e", help="which shapes (a,b,c,d,e)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for iterating")
    parser.add_argument("--plot", action="store_true",
                        help="also sweep nprobe per shape and draw docs/img/search-recall-qps.png "
                             "(needs matplotlib)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.only in (None, "shapes"):
        results = bench_shapes(cfg, set(args.shapes.split(",")), curve=args.plot)
        if args.plot and results:
            print(f"chart: {plot_curves(results)}", flush=True)
    if args.only in (None, "text"):
        bench_text(cfg)
    if args.only in (None, "cold"):
        bench_cold(cfg)
    if args.only in (None, "ingest"):
        bench_ingest(cfg)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, numpy {np.__version__}, pyarrow {pa.__version__}, "
          f"{time.strftime('%Y-%m-%d')}{' (quick sizes)' if args.quick else ''}")


if __name__ == "__main__":
    main()
