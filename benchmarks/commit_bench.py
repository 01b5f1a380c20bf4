"""Commit latency vs table size, and contended commit throughput.

    python -m benchmarks.commit_bench               # local directory and S3 (moto server)
    python -m benchmarks.commit_bench --backends local

Latency: p50/p99 of single-superfile append commits on tables that already
hold 10, 1,000 and 10,000 superfiles. Throughput: commits/s with 1, 2, 4 and
8 writer processes appending to one table for a fixed time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa

from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore

SCHEMA = pa.schema([("_id", pa.int64()), ("x", pa.int64())])
SIZES = (10, 1_000, 10_000)
SAMPLES = 60
SETUP_BATCH = 250
WRITERS = (1, 2, 4, 8)
CONTENDED_SECONDS = 8.0


def _entry(tag):
    return {"id": tag, "path": f"data/{tag}.sf.parquet", "rows": 1000, "bytes": 1 << 20,
            "id_min": 0, "id_max": 999, "stats": {"x": [0, 999]}}


def _fill(manifest, n):
    done = 0
    while done < n:
        k = min(SETUP_BATCH, n - done)
        manifest.commit(CommitRequest(add_entries=tuple(_entry(uuid.uuid4().hex) for _ in range(k))))
        done += k


def latency(uri, options):
    out = {}
    for size in SIZES:
        table_uri = f"{uri}/lat{size}-{uuid.uuid4().hex[:6]}"
        m = Manifest(ObjectStore(table_uri, options))
        m.create(SCHEMA)
        _fill(m, size)
        samples = []
        for _ in range(SAMPLES):
            req = CommitRequest(add_entries=(_entry(uuid.uuid4().hex),))
            t0 = time.perf_counter()
            Manifest(ObjectStore(table_uri, options)).commit(req)  # a fresh handle: no warm cache
            samples.append(time.perf_counter() - t0)
        out[size] = (float(np.percentile(samples, 50)) * 1e3, float(np.percentile(samples, 99)) * 1e3)
    return out


def _writer(uri, options_json, seconds):
    options = json.loads(options_json) or None
    m = Manifest(ObjectStore(uri, options))
    n, end = 0, time.time() + float(seconds)
    while time.time() < end:
        m.commit(CommitRequest(add_entries=(_entry(uuid.uuid4().hex),)), max_retries=1000)
        n += 1
    print(n)


def contended(uri, options):
    out = {}
    for k in WRITERS:
        table_uri = f"{uri}/cont{k}-{uuid.uuid4().hex[:6]}"
        Manifest(ObjectStore(table_uri, options)).create(SCHEMA)
        procs = [subprocess.Popen(
            [sys.executable, "-m", "benchmarks.commit_bench", "--writer", table_uri,
             json.dumps(options), str(CONTENDED_SECONDS)], stdout=subprocess.PIPE, text=True)
            for _ in range(k)]
        total = sum(int(p.communicate()[0].strip().splitlines()[-1]) for p in procs)
        latest = Manifest(ObjectStore(table_uri, options)).latest_version()
        assert latest == total, (latest, total)
        out[k] = total / CONTENDED_SECONDS
    return out


def _moto():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
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


@contextlib.contextmanager
def backend(name, prefix):
    """``(uri, storage_options)`` of a fresh place on ``local`` disk or a moto ``s3`` server."""
    if name == "local":
        yield tempfile.mkdtemp(prefix=prefix), None
        return
    proc, options = _moto()
    try:
        yield "s3://bench", options
    finally:
        proc.terminate()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--writer":
        _writer(*argv[1:4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,s3")
    args = parser.parse_args(argv)
    for name in args.backends.split(","):
        with backend(name, "commit-bench-") as (uri, options):
            lat = latency(uri, options)
            for size, (p50, p99) in lat.items():
                print(f"{name:5s} commit latency with {size:>6,d} superfiles: "
                      f"p50 {p50:6.1f} ms  p99 {p99:6.1f} ms", flush=True)
            print(f"{name:5s} p50 at {SIZES[-1]:,} / p50 at {SIZES[0]}: "
                  f"{lat[SIZES[-1]][0] / lat[SIZES[0]][0]:.2f}x", flush=True)
            for k, rate in contended(uri, options).items():
                print(f"{name:5s} {k} writer process(es): {rate:6.1f} commits/s", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
