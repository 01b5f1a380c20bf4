"""Supertable search quality and speed, each against a baseline in the same run.

    python -m benchmarks.search_bench                 # everything
    python -m benchmarks.search_bench --only vectors  # or: digits, text, ingest

Needs the benchmark extras: pip install -e .[bench] (faiss-cpu, bm25s, lancedb).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import Supertable
from beam_supertable.fts.tokenize import tokenize
from beam_supertable.vector.metric import nearest

N, DIM, CLUSTERS, QUERIES, K = 200_000, 128, 1_000, 1_000, 10
CENTER_SCALE = 1.0   # cluster centres ~1.4x as far apart as a point from its centre
WORDS = ("alpha beta gamma delta river stone cloud forest ember frost lumen quartz "
         "violet amber orbit pixel signal vector cipher harbor meadow summit").split()


def clustered(n, dim, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLUSTERS, dim)).astype(np.float32) * CENTER_SCALE
    x = centers[rng.integers(0, CLUSTERS, n)] + rng.normal(size=(n, dim)).astype(np.float32)
    q = centers[rng.integers(0, CLUSTERS, QUERIES)] + rng.normal(size=(QUERIES, dim)).astype(np.float32)
    body = [" ".join(rng.choice(WORDS, 6)) for _ in range(n)]
    return x.astype(np.float32), q.astype(np.float32), body


def arrow_rows(x, body):
    return pa.table({"body": body, "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])})


def recall_of(t, queries, truth_pos, ids_in_order, k=K, **kw):
    pos = {i: j for j, i in enumerate(ids_in_order)}
    got = t.search(vector=queries, k=k, columns=[], **kw)
    qcol = got["_query"].to_numpy()
    ids = got["_id"].to_numpy()
    hits = 0
    for qi in range(len(queries)):
        mine = {pos[i] for i in ids[qcol == qi]}
        hits += len(mine & set(truth_pos[qi].tolist()))
    return hits / (k * len(queries))


def best_of(fn, repeat=5):
    """Seconds of the fastest of ``repeat`` runs (a shared 2-core machine is noisy)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def brute_force(x, q, k=K):
    xn = (x * x).sum(1)
    out = np.empty((len(q), k), np.int64)
    for s in range(0, len(q), 256):
        d = xn[None, :] - 2 * q[s:s + 256] @ x.T
        part = np.argpartition(d, k, axis=1)[:, :k]
        out[s:s + 256] = np.take_along_axis(part, np.take_along_axis(d, part, 1).argsort(1), 1)
    return out


def table_ids_and_vectors(t):
    rows = t.to_arrow(columns=["_id", "emb"])
    x = np.asarray(rows["emb"].combine_chunks().flatten().to_numpy(), np.float32).reshape(rows.num_rows, -1)
    return rows["_id"].to_pylist(), x


def bench_digits():
    from sklearn.datasets import load_digits
    x = load_digits().data.astype(np.float32)
    d = tempfile.mkdtemp()
    t = Supertable.create(f"{d}/digits", pa.schema([("emb", pa.list_(pa.float32(), 64))]),
                          vector_column="emb")
    t.append(pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64)}))
    ids, xs = table_ids_and_vectors(t)
    truth = nearest(x, xs, "l2", K)
    n_cells = t.properties["grid"]["n_cells"]
    from beam_supertable.vector.search import default_nprobe
    r = recall_of(t, x, truth, ids)
    print(f"digits (1,797 x 64, real): recall@10 {r:.3f} at default nprobe "
          f"{default_nprobe(n_cells)}/{n_cells} cells ({default_nprobe(n_cells) / n_cells:.1%})")
    shutil.rmtree(d)


def bench_vectors_and_ingest(only_vectors=False):
    x, q, body = clustered(N, DIM)
    data = arrow_rows(x, body)
    d = tempfile.mkdtemp()
    t0 = time.perf_counter()
    t = Supertable.create(f"{d}/t", data.schema, vector_column="emb", fts_columns=["body"])
    t.append(data)
    ingest = time.perf_counter() - t0
    print(f"ingest: append of {N:,} rows ({DIM}-d + 6-word text): {ingest:.1f} s, "
          f"{N / ingest:,.0f} rows/s ({len(t.superfiles())} superfiles)", flush=True)
    if not only_vectors:
        lance = bench_lancedb(data)
        if lance:
            print(f"  LanceDB write + IVF_PQ + FTS index: {lance:.1f} s, {N / lance:,.0f} rows/s; "
                  f"ratio supertable/LanceDB {lance / ingest:.2f}x", flush=True)
    t = Supertable.open(f"{d}/t")
    ids, xs = table_ids_and_vectors(t)
    truth = brute_force(xs, q)
    n_cells = t.properties["grid"]["n_cells"]
    from beam_supertable.vector.search import default_nprobe
    nprobe = default_nprobe(n_cells)
    before = t.io.snapshot()["bytes"]
    t0 = time.perf_counter()
    t.search(vector=q, k=K, columns=[])
    cold = time.perf_counter() - t0
    batch_bytes = t.io.snapshot()["bytes"] - before
    r = recall_of(t, q, truth, ids)
    warm = best_of(lambda: t.search(vector=q, k=K, columns=[]))
    size = sum(e["bytes"] for e in t.superfiles())
    print(f"vectors ({N:,} x {DIM}, clustered): recall@10 {r:.3f} at default nprobe "
          f"{nprobe}/{n_cells} cells ({nprobe / n_cells:.1%}); {QUERIES:,} queries as one batch: "
          f"cold {QUERIES / cold:,.0f} q/s, warm (best of 5) {QUERIES / warm:,.0f} q/s; "
          f"the cold batch read {batch_bytes:,} of the table's {size:,} bytes", flush=True)
    one = Supertable.open(f"{d}/t")
    one.search(vector=q[0], k=K)
    print(f"  one query on a cold handle reads {one.io.snapshot()['bytes']:,} bytes in "
          f"{one.io.snapshot()['requests']} ranged reads ({one.io.snapshot()['bytes'] / size:.2%} of the table)")
    bf = best_of(lambda: brute_force(x, q))
    print(f"  numpy brute force: {QUERIES / bf:,.0f} q/s; supertable warm/brute force "
          f"{bf / warm:.2f}x", flush=True)
    faiss_qps, faiss_nprobe, faiss_recall = bench_faiss(x, q, truth_raw=brute_force(x, q), n_cells=n_cells, target=r)
    if faiss_qps:
        print(f"  faiss IndexIVFScalarQuantizer (SQ8, {n_cells} lists, nprobe {faiss_nprobe} "
              f"-> recall {faiss_recall:.3f}): {faiss_qps:,.0f} q/s; supertable warm/faiss "
              f"{(QUERIES / warm) / faiss_qps:.2f}x", flush=True)
    shutil.rmtree(d)


def bench_faiss(x, q, truth_raw, n_cells, target):
    try:
        import faiss
    except ImportError:
        print("  faiss not installed: pip install -e .[bench]")
        return None, None, None
    quantizer = faiss.IndexFlatL2(x.shape[1])
    index = faiss.IndexIVFScalarQuantizer(quantizer, x.shape[1], n_cells, faiss.ScalarQuantizer.QT_8bit)
    index.train(x[np.random.default_rng(0).choice(len(x), min(len(x), 40 * n_cells), replace=False)])
    index.add(x)
    for nprobe in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128):
        index.nprobe = nprobe
        found = index.search(q, K)[1]
        el = best_of(lambda: index.search(q, K))
        rec = np.mean([len(set(found[i]) & set(truth_raw[i])) / K for i in range(len(q))])
        if rec >= target:
            return QUERIES / el, nprobe, rec
    return QUERIES / el, nprobe, rec


def bench_lancedb(data):
    try:
        import lancedb
    except ImportError:
        print("  lancedb not installed: pip install -e .[bench]")
        return None
    d = tempfile.mkdtemp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        db = lancedb.connect(d)
        table = db.create_table("t", data=data)
        table.create_index(metric="l2", vector_column_name="emb",
                           num_partitions=int(round(np.sqrt(len(data)))), num_sub_vectors=16)
        table.create_fts_index("body", use_tantivy=False)
        el = time.perf_counter() - t0
    shutil.rmtree(d)
    return el


def stdlib_docstrings(limit=30_000):
    docs, seen = [], set()
    names = sorted(getattr(sys, "stdlib_module_names", ()))
    skip = {"antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle", "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            if name in skip or name.startswith("_"):
                continue
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - some stdlib modules need a platform or a GUI
                continue
            for obj in [mod] + [v for _, v in inspect.getmembers(mod)]:
                doc = inspect.getdoc(obj) if (inspect.ismodule(obj) or inspect.isclass(obj)
                                             or inspect.isroutine(obj)) else None
                if doc and len(doc) > 40 and doc not in seen:
                    seen.add(doc)
                    docs.append(doc)
            if len(docs) >= limit:
                break
    return docs


def bench_text():
    import bm25s
    docs = stdlib_docstrings()
    rng = np.random.default_rng(0)
    tokens = [tokenize(doc) for doc in docs]
    queries = []
    for i in rng.choice(len(docs), 300, replace=False):
        words = [w for w in tokens[i] if len(w) > 3]
        if len(words) >= 2:
            queries.append(" ".join(rng.choice(words, min(3, len(words)), replace=False)))
    d = tempfile.mkdtemp()
    t = Supertable.create(f"{d}/docs", pa.schema([("n", pa.int64()), ("doc", pa.string())]),
                          fts_columns=["doc"])
    for chunk in np.array_split(np.arange(len(docs)), 4):  # four superfiles
        t.append(pa.table({"n": chunk, "doc": [docs[i] for i in chunk]}))
    t = Supertable.open(f"{d}/docs")
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retriever.index(tokens, show_progress=False)
    agree = tie_agree = total = 0
    t0 = time.perf_counter()
    ours_all = [t.search(text=qq, k=K) for qq in queries]
    ours_time = time.perf_counter() - t0
    for qq, ours in zip(queries, ours_all):
        res, scores = retriever.retrieve([tokenize(qq)], k=K, show_progress=False)
        theirs, their_scores = res[0].tolist(), scores[0].tolist()
        mine = ours["n"].to_pylist()
        my_scores = ours["_score"].to_pylist()
        theirs_kept = [(i, s) for i, s in zip(theirs, their_scores) if s > 0]
        for pos, (i, s) in enumerate(theirs_kept):
            total += 1
            if pos < len(mine) and mine[pos] == i:
                agree += 1
                tie_agree += 1
            elif pos < len(mine) and abs(my_scores[pos] / 2.2 - s) <= 1e-4 * max(1, s):
                tie_agree += 1  # a different row with the same score: a tie
    print(f"text: {len(docs):,} stdlib docstrings, {len(queries)} queries: top-10 positions equal "
          f"to bm25s (lucene, k1=1.2, b=0.75) {agree / total:.1%}, counting equal-score ties "
          f"{tie_agree / total:.1%}; {len(queries) / ours_time:,.0f} queries/s", flush=True)
    shutil.rmtree(d)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["digits", "vectors", "text", "ingest"])
    args = parser.parse_args(argv)
    if args.only in (None, "digits"):
        bench_digits()
    if args.only in (None, "vectors", "ingest"):
        bench_vectors_and_ingest(only_vectors=args.only == "vectors")
    if args.only in (None, "text"):
        bench_text()
    import beam_supertable  # noqa: F401
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
