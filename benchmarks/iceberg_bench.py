"""What the Iceberg face costs a commit, and how fast outside readers scan a table.

    python -m benchmarks.iceberg_bench                    # local directory and S3 (moto server)
    python -m benchmarks.iceberg_bench --backends local --skip-scan
    python -m benchmarks.iceberg_bench --sizes 10,100,1000 --skip-scan --plot

Commit cost: p50/p99 of single-superfile append commits on tables that already
hold 10 and 1,000 superfiles (``--sizes``), with the Iceberg metadata on and off, the
two tables committed to in turn (interleaved), a fresh handle per commit; the
metadata is written beside the commit, so each commit is timed until it returns
and "landed" until its metadata is written too (the next commit starts once it
is, so no commit is timed beside another's metadata): the
manifest's commit alone (as ``commit_bench``), and ``Supertable.append`` of
100 rows (the superfile written, then committed). Scan: a
200,000-row keyed table with 10 % of its rows deleted, read whole by
``Supertable.to_arrow()``, by pyiceberg from the version's metadata, and by
DuckDB through ``to_pyarrow_dataset()`` (best of three, interleaved).
``--plot`` draws the commit and append p50s against the table size to
``docs/img/iceberg-commit.png``.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import Supertable
from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore
from beam_supertable.iceberg import background
from beam_supertable.iceberg.metadata import ENABLED_PROPERTY, ENABLED_VALUE
from benchmarks.commit_bench import _fill, backend

SCHEMA = pa.schema([("_id", pa.int64()), ("x", pa.int64())])
SIZES = (10, 1_000)
BACKEND_NAMES = {"local": "local dir", "s3": "S3 (moto)"}
SAMPLES = 60
SCAN_ROWS = 200_000


def _entry(tag):
    return {"id": tag, "path": f"data/{tag}.sf.parquet", "rows": 1000, "bytes": 1 << 20,
            "id_min": 0, "id_max": 999, "stats": {"x": [0, 999]}, "null_counts": {"x": 0}}


def _timed(samples, on, t0):
    samples[on].append(time.perf_counter() - t0)
    background.drain()
    if on:
        samples["landed"].append(time.perf_counter() - t0)


def _percentiles(samples):
    return {on: (float(np.percentile(s, 50)) * 1e3, float(np.percentile(s, 99)) * 1e3)
            for on, s in samples.items()}


def commit_cost(uri, options, sizes=SIZES):
    out = {}
    for size in sizes:
        tables = {}
        for on in (False, True):
            table_uri = f"{uri}/c{size}-{'on' if on else 'off'}-{uuid.uuid4().hex[:6]}"
            m = Manifest(ObjectStore(table_uri, options))
            m.create(SCHEMA, {ENABLED_PROPERTY: dict(ENABLED_VALUE)} if on else {})
            _fill(m, size)
            tables[on] = table_uri
        samples = {False: [], True: [], "landed": []}
        for i in range(2 * SAMPLES):
            on = bool(i % 2)
            req = CommitRequest(add_entries=(_entry(uuid.uuid4().hex),))
            t0 = time.perf_counter()
            Manifest(ObjectStore(tables[on], options)).commit(req)
            _timed(samples, on, t0)
        out[size] = _percentiles(samples)
    return out


def append_cost(uri, options, sizes=SIZES):
    """The same, through ``Supertable.append`` of 100 rows (writing the superfile)."""
    schema = pa.schema([("k", pa.int64()), ("x", pa.float64())])
    batch = pa.table({"k": np.arange(100), "x": np.linspace(0, 1, 100)}, schema=schema)
    out = {}
    for size in sizes:
        tables = {}
        for on in (False, True):
            table_uri = f"{uri}/a{size}-{'on' if on else 'off'}-{uuid.uuid4().hex[:6]}"
            t = Supertable.create(table_uri, schema, storage_options=options, iceberg=on)
            big = pa.concat_tables([batch] * 10)
            for _ in range(size):
                t.append(big.slice(0, 100), n_shards=1)
            tables[on] = table_uri
        samples = {False: [], True: [], "landed": []}
        for i in range(2 * SAMPLES):
            on = bool(i % 2)
            t = Supertable.open(tables[on], storage_options=options)
            t0 = time.perf_counter()
            t.append(batch, n_shards=1)
            _timed(samples, on, t0)
        out[size] = _percentiles(samples)
    return out


def scan(uri):
    import duckdb
    from pyiceberg.table import StaticTable

    schema = pa.schema([("key", pa.int64()), ("body", pa.string()), ("score", pa.float64())])
    t = Supertable.create(uri, schema, primary_key="key")
    rng = np.random.default_rng(0)
    for start in range(0, SCAN_ROWS, 50_000):
        keys = np.arange(start, start + 50_000)
        t.upsert(pa.table({"key": keys, "body": [f"row {k}" for k in keys],
                           "score": rng.random(len(keys))}, schema=schema))
    t.delete(pc.field("key").isin(pa.array(np.arange(0, SCAN_ROWS, 10))))
    t = Supertable.open(uri)
    location = t.iceberg_metadata_location()
    runs = {"to_arrow": [], "pyiceberg": [], "duckdb (dataset face)": []}
    results = {}
    for _ in range(3):
        t0 = time.perf_counter()
        results["to_arrow"] = Supertable.open(uri).to_arrow().num_rows
        runs["to_arrow"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        results["pyiceberg"] = StaticTable.from_metadata(location).scan().to_arrow().num_rows
        runs["pyiceberg"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        live = Supertable.open(uri).to_pyarrow_dataset()  # noqa: F841 - DuckDB scans it by name
        results["duckdb (dataset face)"] = duckdb.sql(
            "select count(*) from live").fetchall()[0][0]
        runs["duckdb (dataset face)"].append(time.perf_counter() - t0)
    assert len(set(results.values())) == 1, results
    return {name: (min(s) * 1e3, results[name]) for name, s in runs.items()}


def plot(measured):
    """Commit and append p50 against superfiles, Iceberg face on and off, a panel per backend."""
    from benchmarks import plots
    panels = []
    for name, by_what in measured.items():
        series = []
        for what, by_size in by_what.items():
            sizes = sorted(by_size)
            for on, label in ((False, "off"), (True, "on"), ("landed", "on, metadata landed")):
                series.append((f"{what}, Iceberg {label}", sizes,
                               [by_size[n][on][0] for n in sizes]))
        panels.append((BACKEND_NAMES.get(name, name), series))
    return plots.draw("iceberg-commit", panels, xlabel="superfiles in the table",
                      ylabel="p50, ms", title="Commit time against table size, Iceberg face "
                      "on and off", xlog=True, size=(6 * len(panels) ** 0.5, 4),
                      note=plots.machine_note())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="superfiles in the tables committed to, e.g. 10,100,1000")
    parser.add_argument("--skip-scan", action="store_true")
    parser.add_argument("--plot", action="store_true",
                        help="draw docs/img/iceberg-commit.png (needs matplotlib)")
    args = parser.parse_args(argv)
    sizes = tuple(int(n) for n in args.sizes.split(","))
    measured = {}
    for name in args.backends.split(","):
        with backend(name, "iceberg-bench-") as (uri, options):
            for what, measure in (("commit", commit_cost), ("append", append_cost)):
                by_size = measured.setdefault(name, {})[what] = measure(uri, options, sizes)
                for size, by in by_size.items():
                    (off50, off99), (on50, on99) = by[False], by[True]
                    landed50, landed99 = by["landed"]
                    print(f"{name:5s} {what} at {size:>5,d} superfiles: off p50 {off50:6.1f} "
                          f"/ p99 {off99:6.1f} ms; on p50 {on50:6.1f} / p99 {on99:6.1f} ms; "
                          f"p50 ratio on:off {on50 / off50:.2f}x; on, metadata landed p50 "
                          f"{landed50:6.1f} / p99 {landed99:6.1f} ms ({landed50 / off50:.2f}x)",
                          flush=True)
    if args.plot:
        print(f"chart: {plot(measured)}", flush=True)
    if not args.skip_scan:
        base = tempfile.mkdtemp(prefix="iceberg-scan-")
        scanned = scan(os.path.join(base, "t"))
        first = scanned["to_arrow"][0]
        for name, (ms, n) in scanned.items():
            print(f"scan {SCAN_ROWS:,} rows, 10% deleted, {name}: {ms:7.1f} ms ({n:,} rows, "
                  f"{ms / first:.2f}x to_arrow)", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
