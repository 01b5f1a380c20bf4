"""Known-item text retrieval on the standard library's docstrings: supertable vs tantivy, bm25s.

    python -m benchmarks.text_bench                 # 1,000 queries, 3 timed rounds
    python -m benchmarks.text_bench --queries 300 --rounds 1   # for iterating
    python -m benchmarks.text_bench --corpus fortunes --queries 300   # the fortune cookies
    python -m benchmarks.text_bench --jit-cost      # the kernel's compile on a fresh worker

Corpora: ``docstrings`` (the default) or ``fortunes``, the fortune-cookie files of the
``fortunes`` and ``fortunes-min`` packages (``--fortunes-dir``, /usr/share/games/fortunes;
each cookie of at least 40 characters, once).

Corpus: the docstring paragraphs (>= 40 characters) of the installed standard
library, read with ``ast`` (no module imported; ``search_bench.stdlib_paragraphs``).
Queries: paragraphs drawn with a fixed seed; from each, three distinct content words
(letters only, at least four of them, not among Lucene's 33 English stop words, or
Snowball's 125 with ``--drawn-without snowball``) drawn as written, and
the paragraph is the one known item the query must find. Quality is the mean
reciprocal rank of that paragraph in the top 10 (0 when absent), with success@1 and
@10.

Systems, all on the same paragraphs and queries, in the same run:

- supertable: one table, text column indexed, English analysis (its default:
  Snowball stemming, Lucene's 33 English stop words) and, for comparison, the plain
  tokenizer; for quality only, stemming without stop words and the previous default
  (stemming and Snowball's English stop words);
  a warm handle, ``search(text=q, k=10)`` returning ``_id`` and ``_score`` only, and
  with the paragraph-number column;
- tantivy (Python package): the ``en_stem`` tokenizer (its English analyzer: simple
  tokenizer, lowercasing, long-token removal, Snowball English stemmer; no stop
  words), in RAM, ``parse_query`` + ``search(q, 10)``; the hits only, and with the
  stored paragraph number fetched per hit;
- bm25s: its tokenizer with its English stop words and the PyStemmer Snowball English
  stemmer, the Lucene BM25 variant (k1 1.2, b 0.75), ``retrieve(k=10)``.

Latency: single queries, warm, interleaved (each query runs on every system and
flavour, in a random order, before the next query), p50 and p99 over every timed call.

Needs the bench extra: pip install -e .[bench] (tantivy, bm25s; PyStemmer is a
dependency).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa

from beam_supertable import Supertable
from beam_supertable.fts.analysis import LUCENE_STOP_WORDS, SNOWBALL_STOP_WORDS
from beam_supertable.fts.tokenize import tokenize
from benchmarks.search_bench import stdlib_paragraphs

K = 10
QUERY_WORDS = 3
MIN_WORD = 4


def known_item_queries(docs, n, seed=0, stop_words=LUCENE_STOP_WORDS):
    """(query, paragraph) pairs: three content words (not ``stop_words``) drawn from
    one paragraph."""
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.permutation(len(docs)):
        words = sorted({w for w in tokenize(docs[i])
                        if w.isalpha() and len(w) >= MIN_WORD and w not in stop_words})
        if len(words) < QUERY_WORDS:
            continue
        out.append((" ".join(rng.choice(words, QUERY_WORDS, replace=False)), int(i)))
        if len(out) == n:
            break
    return out


def fortunes(folder):
    """The fortune cookies of ``folder`` (at least 40 characters each, each once)."""
    seen = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        path = os.path.join(folder, name)
        if "." in name or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for cookie in f.read().split("\n%\n"):
                cookie = cookie.strip().strip("%").strip()
                if len(cookie) >= 40:
                    seen.setdefault(cookie, None)
    if not seen:
        raise SystemExit(f"--fortunes-dir {folder}: no fortune files there "
                         "(apt-get install fortunes, or apt-get download it and unpack it)")
    return list(seen)


def ours(docs, analysis):
    d = tempfile.mkdtemp(prefix="text-bench-")
    t0 = time.perf_counter()
    t = Supertable.create(f"{d}/docs", pa.schema([("n", pa.int64()), ("doc", pa.string())]),
                          fts_columns=["doc"], text_analysis=analysis)
    t.append(pa.table({"n": np.arange(len(docs)), "doc": docs}))
    built = time.perf_counter() - t0
    t = Supertable.open(f"{d}/docs")

    def ids(q):
        return t.search(text=q, k=K, columns=[])

    def keyed(q):
        return t.search(text=q, k=K, columns=["n"])["n"].to_pylist()

    return {"ids": ids, "keyed": keyed, "built": built, "cleanup": lambda: shutil.rmtree(d),
            "superfiles": len(t.superfiles())}


def tantivy_side(docs):
    import tantivy
    t0 = time.perf_counter()
    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("n", stored=True)
    builder.add_text_field("doc", stored=False, tokenizer_name="en_stem")
    index = tantivy.Index(builder.build())
    writer = index.writer(heap_size=256 << 20, num_threads=1)
    for i, doc in enumerate(docs):
        writer.add_document(tantivy.Document(n=i, doc=doc))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()
    built = time.perf_counter() - t0

    def ids(q):
        return searcher.search(index.parse_query(q, ["doc"]), K).hits

    def keyed(q):
        hits = searcher.search(index.parse_query(q, ["doc"]), K).hits
        return [searcher.doc(addr)["n"][0] for _, addr in hits]

    return {"ids": ids, "keyed": keyed, "built": built, "segments": searcher.num_segments}


def bm25s_side(docs):
    import bm25s
    import Stemmer
    stemmer = Stemmer.Stemmer("english")
    t0 = time.perf_counter()
    tokens = bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retriever.index(tokens, show_progress=False)
    built = time.perf_counter() - t0

    def keyed(q):
        qt = bm25s.tokenize([q], stopwords="en", stemmer=stemmer, return_ids=False,
                            show_progress=False)
        if not qt[0]:
            return []
        res, scores = retriever.retrieve(qt, k=K, show_progress=False, n_threads=1)
        return [int(r) for r, s in zip(res[0], scores[0]) if s > 0]

    return {"keyed": keyed, "built": built}


def _quality_only(side):
    """A side answered for MRR, not timed."""
    return {"quality": side["keyed"], "built": side["built"], "cleanup": side["cleanup"],
            "superfiles": side["superfiles"]}


def reciprocal_ranks(found, want):
    return [1.0 / (hits.index(w) + 1) if w in hits else 0.0 for hits, w in zip(found, want)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over the queries")
    parser.add_argument("--corpus", choices=("docstrings", "fortunes"), default="docstrings")
    parser.add_argument("--fortunes-dir", default="/usr/share/games/fortunes")
    parser.add_argument("--drawn-without", choices=("lucene", "snowball"), default="lucene",
                        help="the stop words a query's words are not drawn from")
    parser.add_argument("--jit-cost", action="store_true",
                        help="only measure the compiled pass's cost to a fresh worker")
    args = parser.parse_args(argv)
    if args.jit_cost:
        return jit_cost()
    docs = stdlib_paragraphs() if args.corpus == "docstrings" else fortunes(args.fortunes_dir)
    queries = known_item_queries(docs, args.queries, stop_words=LUCENE_STOP_WORDS
                                 if args.drawn_without == "lucene" else SNOWBALL_STOP_WORDS)
    want = [i for _, i in queries]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        systems = {
            "supertable, English analysis": ours(docs, "english"),
            "supertable, plain tokenizer": ours(docs, None),
            "supertable, stemming, no stop words": _quality_only(
                ours(docs, {"stop_words": False})),
            "supertable, stemming, Snowball stop words (previous default)": _quality_only(
                ours(docs, {"stop_words": True})),
            "tantivy en_stem": tantivy_side(docs),
            "bm25s (en stop words, Snowball English)": bm25s_side(docs),
        }
    what = "stdlib docstring paragraphs" if args.corpus == "docstrings" else "fortune cookies"
    print(f"corpus: {len(docs):,} {what}; {len(queries)} known-item queries "
          f"of {QUERY_WORDS} words, k={K}")
    for name, s in systems.items():
        extra = f", {s['superfiles']} superfile(s)" if "superfiles" in s else \
            f", {s['segments']} segment(s)" if "segments" in s else ""
        print(f"  {name}: index built in {s['built']:.1f} s{extra}")
    # Quality, then latency: every call of a query on every system before the next query.
    quality = {}
    for name, s in systems.items():
        answer = s.get("keyed", s.get("quality"))
        rr = reciprocal_ranks([answer(q) for q, _ in queries], want)
        quality[name] = (np.mean(rr), np.mean([r == 1.0 for r in rr]),
                         np.mean([r > 0 for r in rr]))
    calls = [(name, kind, s[kind]) for name, s in systems.items()
             for kind in ("ids", "keyed") if kind in s]
    for _, _, fn in calls:   # warm every side
        for q, _ in queries[:50]:
            fn(q)
    times = {(name, kind): [] for name, kind, _ in calls}
    rng = np.random.default_rng(1)
    gc.disable()
    try:
        for _ in range(args.rounds):
            for q, _ in queries:
                # A fresh order per query: no call always follows the same one (the
                # same query on the same index just before runs on warm CPU caches).
                for c in rng.permutation(len(calls)):
                    name, kind, fn = calls[c]
                    t0 = time.perf_counter()
                    fn(q)
                    times[(name, kind)].append(time.perf_counter() - t0)
            gc.collect()
    finally:
        gc.enable()
    p = {key: (np.percentile(v, 50) * 1e3, np.percentile(v, 99) * 1e3)
         for key, v in times.items()}
    print("\n| system | MRR@10 | success@1 | success@10 | p50 / p99, ids and scores | "
          "p50 / p99, with the paragraph number |")
    print("|---|---|---|---|---|---|")
    for name in systems:
        mrr, s1, s10 = quality[name]
        cells = [f"{p[(name, kind)][0]:.3f} / {p[(name, kind)][1]:.3f} ms"
                 if (name, kind) in p else "–" for kind in ("ids", "keyed")]
        print(f"| {name} | {mrr:.3f} | {s1:.1%} | {s10:.1%} | {cells[0]} | {cells[1]} |")
    us, them = "supertable, English analysis", "tantivy en_stem"
    print(f"\nratios, supertable English / tantivy: MRR {quality[us][0] / quality[them][0]:.3f}x; "
          f"p50 ids {p[(us, 'ids')][0] / p[(them, 'ids')][0]:.2f}x, "
          f"p50 with the paragraph number {p[(us, 'keyed')][0] / p[(them, 'keyed')][0]:.2f}x")
    import bm25s
    import tantivy  # noqa: F401 - for its version
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, tantivy {_version('tantivy')}, bm25s "
          f"{bm25s.__version__}, PyStemmer {_version('PyStemmer')}, pyarrow {pa.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for s in systems.values():
        if "cleanup" in s:
            s["cleanup"]()


_FIRST_CALL = """
import time
t0 = time.perf_counter()
import numpy as np
from types import SimpleNamespace
from beam_supertable.fts import kernels
ix = SimpleNamespace(rows=np.array([0, 2, 1, 2], np.int32), tf=np.ones(4, np.int32),
                     start=np.array([0, 2], np.int64), df=np.array([2, 2], np.int32))
t1 = time.perf_counter()
kernels.index_top(ix, np.array([0, 1]), np.ones(2), np.zeros(2, np.int8), np.ones(3), 10)
print(f"{t1 - t0:.2f} {time.perf_counter() - t1:.2f}")
"""


def jit_cost():
    """The compiled pass's cost to a fresh worker: importing numba and the module, then
    the first call, with an empty cache folder (it compiles), then again (it loads)."""
    import subprocess
    import sys
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for what in ("no cache (compiles)", "cached on disk"):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()
            print(f"first text search's kernel, {what}: importing the package and numba "
                  f"{out[0]} s, first call {out[1]} s")


def _version(dist):
    from importlib.metadata import version
    return version(dist)


if __name__ == "__main__":
    main()
