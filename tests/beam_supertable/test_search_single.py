"""The single-query path: the batch's results, inline, with no threads started."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable import Supertable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
D = 24


def _table(uri, n=9000, seed=0, **kw):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(60, D)) * 2
    x = (centers[rng.integers(0, 60, n)] + rng.normal(size=(n, D))).astype(np.float32)
    data = pa.table({"n": np.arange(n), "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), D)})
    t = Supertable.create(uri, data.schema, vector_column="emb", **kw)
    t.append(data.slice(0, n // 2), n_shards=3)
    t.append(data.slice(n // 2), n_shards=2)
    return x


def _by_query(batch, n):
    q = batch["_query"].to_numpy()
    return [batch.filter(pa.array(q == i)) for i in range(n)]


def test_single_queries_return_what_the_batch_returns(table_location):
    uri, options = table_location
    x = _table(uri, storage_options=options)
    queries = x[:40] + 0.1
    for handle in ("cold", "warm"):
        t = Supertable.open(uri, storage_options=options)
        if handle == "warm":
            t.search(vector=queries, k=10)
            t.search(vector=queries, k=10)
        batch = _by_query(t.search(vector=queries, k=10, nprobe=6), len(queries))
        single_handle = Supertable.open(uri, storage_options=options) if handle == "cold" else t
        for i, q in enumerate(queries):
            one = single_handle.search(vector=q, k=10, nprobe=6)
            assert one["_id"].to_pylist() == batch[i]["_id"].to_pylist(), (handle, i)
            assert one["n"].to_pylist() == batch[i]["n"].to_pylist()
            np.testing.assert_allclose(one["_distance"].to_numpy(), batch[i]["_distance"].to_numpy(),
                                       rtol=1e-5, atol=1e-5)


def test_single_queries_start_no_threads(tmp_path):
    uri = str(tmp_path / "t")
    x = _table(uri)
    np.save(tmp_path / "q.npy", x[:30] + 0.1)
    script = textwrap.dedent(f"""
        import threading, numpy as np
        from beam_supertable import Supertable
        started = []
        start = threading.Thread.start
        def counted(thread):
            started.append(thread.name)
            return start(thread)
        threading.Thread.start = counted
        t = Supertable.open({uri!r})
        queries = np.load({str(tmp_path / 'q.npy')!r})
        for q in queries:
            t.search(vector=q, k=5)
        print("single", len(started))
        t.search(vector=queries, k=5)
        first = len(started)
        t.search(vector=queries, k=5)
        t.search(vector=queries, k=5)
        print("later batches", len(started) - first)
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.split("\n")
    # Single queries run inline; batches share threads made once per process.
    assert "single 0" in out
    assert "later batches 0" in out


def test_cold_query_for_ids_reads_only_the_hits_row_groups(tmp_path):
    """Returning only ``_id`` once read the whole ``_id`` column: a request per row group."""
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(60, 8)) * 6)[rng.integers(0, 60, 6000)] + rng.normal(size=(6000, 8))
    x = x.astype(np.float32)
    schema = pa.schema([("n", pa.int64()), ("emb", pa.list_(pa.float32(), 8))])
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, schema, vector_column="emb")
    t.append(pa.table({"n": np.arange(6000),
                       "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8)}))
    groups = sum(pq.ParquetFile(f"{uri}/{e['path']}").metadata.num_row_groups
                 for e in t.superfiles())
    assert groups > 20
    cold = Supertable.open(uri)
    got = cold.search(vector=x[7], k=5, columns=[])
    assert got["_id"].to_pylist() == t.search(vector=x[7], k=5)["_id"].to_pylist()
    # The footer, the index sections and the few row groups holding the
    # probed cells and the hits: far fewer requests than there are row groups.
    assert cold.io.requests < groups // 2
