"""Commits and a cold first query on every backend, each server in its own process.

    python -m benchmarks.stores_bench [--commits 50] [--rows 20000]

Backends: local disk, the S3 server (moto, the tests' one), SeaweedFS, Azurite and
fake-gcs-server (installed by ./scripts/store-servers), all on 127.0.0.1, in one run,
interleaved commit by commit. For each:

* the probe: time of the two creates and the delete, once per process and endpoint;
* commit latency, p50 and p99, of one-row tokened appends (a commit: the superfile
  upload, the version document, the Iceberg metadata), and the time of a loop of 10;
* a cold first query: a fresh handle's open and one top-10 vector and one text query,
  counted in store calls (each a round trip, made one after another), bytes and time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid

import numpy as np
import pyarrow as pa

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from beam_supertable import Supertable  # noqa: E402
from beam_supertable.format import store as store_mod  # noqa: E402
from beam_supertable.format.store import ObjectStore  # noqa: E402
from beam_supertable.vector.index import VectorIndex  # noqa: E402
from tests import store_servers  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("seq", pa.int64()), ("body", pa.string())])


def _moto(folder: pathlib.Path) -> store_servers.Server:
    port = store_servers.free_port()
    return store_servers.Server("moto", [sys.executable, "-m", "tests.s3_server", "127.0.0.1",
                                         str(port)], port, folder,
                                env={"PYTHONPATH": str(ROOT)})


def _moto_location(server) -> tuple:
    import boto3
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id="x",
                 aws_secret_access_key="x", region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}", {"key": "x", "secret": "x", "client_kwargs": {
        "endpoint_url": server.endpoint, "region_name": "us-east-1"}}


def start_backends(folder: pathlib.Path) -> dict:
    """name -> (server or None, a function giving a fresh (uri prefix, options))."""
    servers = {"s3 (moto)": _moto(folder / "moto"),
               "SeaweedFS": store_servers.start_seaweedfs(folder / "seaweedfs"),
               "Azurite": store_servers.start_azurite(folder / "azurite"),
               "fake-gcs-server": store_servers.start_fake_gcs(folder / "gcs")}
    s = servers
    return {
        "local disk": (None, lambda: (str(folder / "local" / uuid.uuid4().hex), None)),
        "s3 (moto)": (s["s3 (moto)"], lambda: _moto_location(s["s3 (moto)"])),
        "SeaweedFS": (s["SeaweedFS"], lambda: (
            f"s3://{store_servers.seaweed_bucket(s['SeaweedFS'])}",
            store_servers.seaweed_options(s["SeaweedFS"]))),
        "Azurite": (s["Azurite"], lambda: (
            f"az://{store_servers.azure_container(s['Azurite'])}",
            store_servers.azure_options(s["Azurite"]))),
        "fake-gcs-server": (s["fake-gcs-server"], lambda: (
            f"gs://{store_servers.gcs_bucket(s['fake-gcs-server'])}",
            store_servers.gcs_options(s["fake-gcs-server"]))),
    }


class Requests:
    """Every store request of a block (nested calls once), with when it ran: the count,
    and the sequential round trips (requests in flight together count once)."""

    CALLS = ("get", "get_range", "exists", "head", "list")

    def __init__(self):
        self._saved, self._local = {}, threading.local()
        self._lock = threading.Lock()
        self.spans, self.bytes = [], 0

    def __enter__(self):
        for name in self.CALLS:
            self._saved[name] = getattr(ObjectStore, name)
            setattr(ObjectStore, name, self._wrap(self._saved[name]))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(ObjectStore, name, fn)

    def _wrap(self, fn):
        def timed(store, *args, **kwargs):
            if getattr(self._local, "inside", False):
                return fn(store, *args, **kwargs)
            self._local.inside = True
            t0 = time.perf_counter()
            try:
                out = fn(store, *args, **kwargs)
            finally:
                self._local.inside = False
            with self._lock:
                self.spans.append((t0, time.perf_counter()))
                if isinstance(out, (bytes, bytearray)):
                    self.bytes += len(out)
            return out
        return timed

    @property
    def count(self) -> int:
        return len(self.spans)

    @property
    def sequential(self) -> int:
        rounds, end = 0, -1.0
        for start, stop in sorted(self.spans):
            if start >= end:
                rounds += 1
                end = stop
            else:
                end = max(end, stop)
        return rounds


def pct(values, q):
    return float(np.percentile(np.array(values), q))


def bench_probe(backends) -> None:
    print("\n## The probe (two creates and a delete, once per process and endpoint)")
    for name, (_, location) in backends.items():
        if name == "local disk":
            continue
        times = []
        for _ in range(5):
            prefix, options = location()
            store = ObjectStore(f"{prefix}/probe", options)
            t0 = time.perf_counter()
            store.probe()
            times.append(time.perf_counter() - t0)
        print(f"- {name}: {statistics.median(times) * 1e3:.1f} ms (median of 5)")


def bench_commits(backends, commits: int) -> None:
    tables = {}
    for name, (_, location) in backends.items():
        prefix, options = location()
        tables[name] = Supertable.create(f"{prefix}/commits", SCHEMA, storage_options=options)
    times = {name: [] for name in tables}
    for i in range(commits):               # interleaved: backend after backend per commit
        for name, table in tables.items():
            t0 = time.perf_counter()
            table.append(pa.table({"seq": [i], "body": ["x"]}), token=f"c{i}")
            times[name].append(time.perf_counter() - t0)
    loops = {name: [] for name in tables}
    for r in range(3):
        for name, table in tables.items():
            t0 = time.perf_counter()
            for i in range(10):
                table.append(pa.table({"seq": [i], "body": ["y"]}), token=f"loop{r}/{i}")
            loops[name].append(time.perf_counter() - t0)
    print(f"\n## Commits ({commits} one-row tokened appends per backend, interleaved; "
          "Iceberg metadata on)")
    print("| backend | p50 | p99 | 10-commit loop (best of 3) |")
    print("|---|---|---|---|")
    for name in tables:
        print(f"| {name} | {pct(times[name], 50) * 1e3:.1f} ms | "
              f"{pct(times[name], 99) * 1e3:.1f} ms | {min(loops[name]):.2f} s |")


def bench_cold(backends, rows: int) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, 32)).astype(np.float32)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "ember", "frost"]
    data = pa.table({"n": np.arange(rows), "body": [" ".join(rng.choice(words, 5))
                                                     for _ in range(rows)],
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 32)})
    print(f"\n## Cold first query ({rows:,} rows x 32-d, vector and text indexes; a fresh "
          "handle: open + one query, median of 5)")
    print("| backend | query | reads | requests | sequential round trips | bytes | time |")
    print("|---|---|---|---|---|---|---|")
    for name, (_, location) in backends.items():
        prefix, options = location()
        uri = f"{prefix}/cold"
        table = Supertable.create(uri, data.schema, vector_column="emb", fts_columns=["body"],
                                  storage_options=options)
        table.append(data)
        for label, query in (("vector, top 10", {"vector": x[3]}),
                             ("text, top 10", {"text": "river ember"})):
            for reads in ("before", "after"):   # interleaved, per query
                with _reads_as(reads):
                    samples = []
                    for _ in range(5):
                        with Requests() as requests:
                            t0 = time.perf_counter()
                            cold = Supertable.open(uri, storage_options=options)
                            cold.search(k=10, columns=["n"], **query)
                            elapsed = time.perf_counter() - t0
                        samples.append((elapsed, requests.count, requests.sequential,
                                        requests.bytes))
                elapsed, count, sequential, nbytes = sorted(samples)[2]
                print(f"| {name} | {label} | {reads} | {count} | {sequential} | {nbytes:,} | "
                      f"{elapsed * 1e3:.0f} ms |", flush=True)


@contextlib.contextmanager
def _reads_as(reads: str):
    """``before``: each run's codes and each row group read alone, one after another (the
    read path before near runs shared a read and remote reads went out together)."""
    if reads == "after":
        yield
        return
    saved_codes, saved_remote = VectorIndex.load_codes, ObjectStore.remote
    VectorIndex.load_codes = lambda self, spans: None
    ObjectStore.remote = property(lambda self: False)
    try:
        yield
    finally:
        VectorIndex.load_codes, ObjectStore.remote = saved_codes, saved_remote


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=50)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        backends = start_backends(pathlib.Path(tmp))
        try:
            store_mod._PROBED.clear()
            bench_probe(backends)
            bench_commits(backends, args.commits)
            bench_cold(backends, args.rows)
        finally:
            for server, _ in backends.values():
                if server is not None:
                    server.stop()


if __name__ == "__main__":
    main()
