"""What reading a table's changes costs, against diffing two snapshots.

    python -m benchmarks.changes_bench                   # local directory and S3 (moto server)
    python -m benchmarks.changes_bench --backends local --rows 200000
    python -m benchmarks.changes_bench --backends local --parts consumer --lag 10

Range read: a keyed table of ``--rows`` rows (1,000,000 by default; an id, a
label, a score and an 80-byte payload, appended in ten commits), then one
upsert of 1,000 random keys. ``Supertable.changes(v - 1, v)`` on a fresh handle
against the same answer found by diffing ``to_arrow()`` of versions ``v - 1``
and ``v`` (two fresh handles; the rows whose ``_id`` is in one and not the
other), interleaved, best of five: time and bytes read from the store (every
GET and ranged read: manifests, parts, deletion vectors, superfiles).

What a lagging consumer costs: on the same kind of table, a consumer recorded
at the version after the appends, then ``--lag`` upserts of 1,000 keys (neighbouring
runs, or keys drawn at random), then a dry-run ``vacuum(retain_versions=1,
older_than=0)``: the versions and bytes the consumer holds (``held_versions``,
``held_bytes``) against the table's superfiles, per version held.

Tail latency: a DirectRunner pipeline tails the table with
``ReadChangesFromSupertable`` (``poll_interval`` 50 ms) while 40 one-row upserts
land 200 ms apart: the time from a commit's return to the moment its insertion
reaches a DoFn downstream, p50 and p99.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import Supertable
from beam_supertable.format.store import ObjectStore
from benchmarks.commit_bench import backend

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string()), ("score", pa.float64()),
                    ("payload", pa.string())])
UPSERT_ROWS = 1_000
ROUNDS = 5
TAIL_COMMITS = 40
TAIL_GAP_S = 0.2


class _Counted:
    """Counts the bytes every ObjectStore read returns while it is entered."""

    def __init__(self):
        self.bytes = 0

    def __enter__(self):
        self._get, self._range = ObjectStore.get, ObjectStore.get_range
        counter = self

        def get(store, path):
            data = counter._get(store, path)
            counter.bytes += len(data)
            return data

        def get_range(store, path, start, end):
            data = counter._range(store, path, start, end)
            counter.bytes += len(data)
            return data

        ObjectStore.get, ObjectStore.get_range = get, get_range
        return self

    def __exit__(self, *exc):
        ObjectStore.get, ObjectStore.get_range = self._get, self._range


def _rows(ids, rng, label):
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "label": [label] * n,
                     "score": rng.random(n),
                     "payload": [rng.bytes(40).hex() for _ in range(n)]}, schema=SCHEMA)


def build(uri, options, rows):
    """The table, then two upserts of ``UPSERT_ROWS`` keys: a run of neighbouring keys
    (the rows a change feed usually sees: recent ones) and keys drawn at random."""
    rng = np.random.default_rng(1)
    t = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    step = rows // 10
    for start in range(0, rows, step):
        t.append(_rows(np.arange(start, min(rows, start + step)), rng, "base"))
    first = int(rng.integers(0, rows - UPSERT_ROWS))
    t.upsert(_rows(np.arange(first, first + UPSERT_ROWS), rng, "run"))
    t.upsert(_rows(np.sort(rng.choice(rows, UPSERT_ROWS, replace=False)), rng, "random"))
    return t


def _feed(uri, options, version):
    t = Supertable.open(uri, storage_options=options)
    return t.changes(version - 1, version)


def _diff(uri, options, version):
    before = Supertable.open(uri, version=version - 1, storage_options=options).to_arrow()
    after = Supertable.open(uri, version=version, storage_options=options).to_arrow()
    gone = before.filter(pc.invert(pc.is_in(before["_id"], after["_id"])))
    new = after.filter(pc.invert(pc.is_in(after["_id"], before["_id"])))
    return gone, new


def range_read(uri, options, rows):
    """``{shape: {"feed"|"diff": (best seconds, bytes)}}`` and the table's bytes."""
    t = build(uri, options, rows)
    table_bytes = sum(e["bytes"] for e in t.superfiles())
    out = {}
    for shape, version in (("neighbouring keys", t.version - 1), ("random keys", t.version)):
        out[shape] = _best(uri, options, version)
    return table_bytes, out


def _best(uri, options, version):
    best = {"feed": (float("inf"), 0), "diff": (float("inf"), 0)}
    for _ in range(ROUNDS):
        for name, fn in (("feed", _feed), ("diff", _diff)):
            with _Counted() as counted:
                t0 = time.perf_counter()
                out = fn(uri, options, version)
                seconds = time.perf_counter() - t0
            best[name] = min(best[name], (seconds, counted.bytes))
            if name == "feed":
                assert out.num_rows == 2 * UPSERT_ROWS, out.num_rows
            else:
                assert out[0].num_rows == out[1].num_rows == UPSERT_ROWS
    return best


def tail_latency(uri, options):
    import apache_beam as beam

    from beam_supertable import ReadChangesFromSupertable

    t = Supertable.create(f"{uri}/tail", SCHEMA, primary_key="id", storage_options=options)
    landed = {}
    arrivals = tempfile.mktemp(prefix="changes-bench-arrivals-")

    class _Arrive(beam.DoFn):
        def process(self, change):
            if change.diff > 0:
                with open(arrivals, "a") as f:
                    f.write(f"{change.key} {time.time()}\n")

    def writer():
        rng = np.random.default_rng(2)
        time.sleep(3.0)   # the pipeline starts meanwhile
        for i in range(TAIL_COMMITS):
            t.upsert(_rows([i], rng, "tail"))
            landed[i] = time.time()
            time.sleep(TAIL_GAP_S)

    thread = threading.Thread(target=writer)
    thread.start()
    with beam.Pipeline() as p:
        _ = (p | ReadChangesFromSupertable(t.uri, start_version=0, end_version=TAIL_COMMITS,
                                           poll_interval=0.05, storage_options=options)
             | beam.ParDo(_Arrive()))
    thread.join()
    with open(arrivals) as f:
        arrived = {int(k): float(at) for k, at in (line.split() for line in f)}
    os.remove(arrivals)
    lags = np.array([arrived[i] - landed[i] for i in range(TAIL_COMMITS)]) * 1000
    return float(np.percentile(lags, 50)), float(np.percentile(lags, 99))


def consumer_cost(uri, options, rows, lag, shape, optimized=False):
    """``(held versions, held bytes, superfile bytes of the latest version)`` of a
    consumer ``lag`` upserts of ``UPSERT_ROWS`` keys behind (and an optimize that
    rewrote the whole table, when ``optimized``)."""
    rng = np.random.default_rng(3)
    t = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    step = rows // 10
    for start in range(0, rows, step):
        t.append(_rows(np.arange(start, min(rows, start + step)), rng, "base"))
    t.changes(t.version, t.version, consumer="lagging")   # registers it here
    for i in range(lag):
        if shape == "neighbouring keys":
            first = int(rng.integers(0, rows - UPSERT_ROWS))
            keys = np.arange(first, first + UPSERT_ROWS)
        else:
            keys = np.sort(rng.choice(rows, UPSERT_ROWS, replace=False))
        t.upsert(_rows(keys, rng, f"lag{i}"))
    if optimized:
        t.optimize(target_file_bytes=4 * 2**30)   # every superfile is small: all rewritten
    report = t.vacuum(retain_versions=1, older_than=0, dry_run=True)
    assert len(report.held_versions) == lag + optimized, report.held_versions
    return len(report.held_versions), report.held_bytes, sum(e["bytes"] for e in t.superfiles())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--parts", default="range,consumer,tail",
                        help="what to measure: range, consumer, tail (comma-separated)")
    parser.add_argument("--lag", type=int, default=10,
                        help="upserts a consumer lags behind (default 10)")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    for name in args.backends.split(","):
        with backend(name, "changes-bench-") as (uri, options):
            if "consumer" in parts:
                cases = [("neighbouring keys", False), ("random keys", False),
                         ("random keys", True)]
                for i, (shape, optimized) in enumerate(cases):
                    held, held_bytes, table_bytes = consumer_cost(
                        f"{uri}/consumer{i}", options, args.rows, args.lag, shape, optimized)
                    print(f"{name:5s} a consumer {args.lag} upserts of {UPSERT_ROWS:,} "
                          f"{shape}{' and a full optimize' if optimized else ''} behind on {args.rows:,} rows ({table_bytes / 2**20:.1f} "
                          f"MiB of superfiles) holds {held} versions, "
                          f"{held_bytes / 2**20:.2f} MiB ({held_bytes / held / 2**20:.2f} MiB "
                          f"a version, {100 * held_bytes / table_bytes:.1f} % of the table)",
                          flush=True)
            if "range" not in parts:
                table_bytes, shapes = 0, {}
            else:
                table_bytes, shapes = range_read(f"{uri}/range", options, args.rows)
            for shape, best in shapes.items():
                (fs, fb), (ds, db) = best["feed"], best["diff"]
                print(f"{name:5s} changes of one {UPSERT_ROWS:,}-row upsert of {shape} on "
                      f"{args.rows:,} rows ({table_bytes / 2**20:.1f} MiB of superfiles):",
                      flush=True)
                print(f"{name:5s}   changes(v-1, v): {fs * 1000:8.1f} ms, {fb / 2**20:7.2f} MiB "
                      f"read ({100 * fb / table_bytes:.2f} % of the table)", flush=True)
                print(f"{name:5s}   diff of two to_arrow(): {ds * 1000:8.1f} ms, "
                      f"{db / 2**20:7.2f} MiB read", flush=True)
                print(f"{name:5s}   ratio: {ds / fs:.0f}x faster, {db / max(fb, 1):.0f}x fewer "
                      f"bytes", flush=True)
            if "tail" not in parts:
                continue
            p50, p99 = tail_latency(uri, options)
            print(f"{name:5s} tail latency, commit to emitted change (DirectRunner, poll 50 ms): "
                  f"p50 {p50:.0f} ms  p99 {p99:.0f} ms", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}", flush=True)


if __name__ == "__main__":
    main()
