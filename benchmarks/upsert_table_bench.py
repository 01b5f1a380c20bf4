"""``Supertable.upsert`` against delta-rs ``merge`` and LanceDB ``merge_insert``.

    python -m benchmarks.upsert_table_bench                  # 500,000 rows, 50,000 upserted
    python -m benchmarks.upsert_table_bench --rows 100000 --upserts 10000
    python -m benchmarks.upsert_table_bench --rows 5000000 --only-supertable   # scale

A table of ``--rows`` rows (``id`` int64 key, ``value`` int64, ``emb`` 64-d
float32) on a local directory, then one upsert of ``--upserts`` rows: half
of them existing keys (drawn at random), half new keys. Each system gets the
same Arrow data in the same run; only the upsert call is timed (best of
``--rounds``, each on a fresh copy of the loaded table). The delta-rs and
LanceDB baselines run when ``deltalake`` / ``lancedb`` import, and the
output says so when they do not.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from beam_supertable import Supertable

DIM = 64


def make_data(rows: int, upserts: int, seed: int = 0):
    """(base table, upsert batch): the batch replaces ``upserts // 2`` keys and adds the rest."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, DIM)).astype(np.float32)
    base = pa.table({
        "id": pa.array(np.arange(rows, dtype=np.int64)),
        "value": pa.array(np.zeros(rows, dtype=np.int64)),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM),
    })
    old = rng.choice(rows, upserts // 2, replace=False).astype(np.int64)
    new = np.arange(rows, rows + upserts - len(old), dtype=np.int64)
    ids = rng.permutation(np.concatenate([old, new]))
    y = rng.normal(size=(len(ids), DIM)).astype(np.float32)
    batch = pa.table({
        "id": pa.array(ids),
        "value": pa.array(np.ones(len(ids), dtype=np.int64)),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(y.ravel()), DIM),
    })
    return base, batch


def _check(rows: int, total: int, ones: int, upserts: int, name: str) -> None:
    if total != rows + upserts - upserts // 2 or ones != upserts:
        raise AssertionError(f"{name}: {total} rows, {ones} updated; expected "
                             f"{rows + upserts - upserts // 2} and {upserts}")


def bench_supertable(root: str, base: pa.Table, batch: pa.Table, rounds: int) -> dict:
    best, io, load_s = None, None, None
    for r in range(rounds):
        uri = os.path.join(root, f"st{r}")
        t = Supertable.create(uri, base.schema, vector_column="emb", primary_key="id")
        t0 = time.perf_counter()
        t.append(base)
        load_s = time.perf_counter() - t0
        t = Supertable.open(uri)            # a cold handle: nothing cached
        t0 = time.perf_counter()
        t.upsert(batch)
        took = time.perf_counter() - t0
        if best is None or took < best:
            best, io = took, t.io.snapshot()
        t = Supertable.open(uri)
        total = t.count_rows()
        ones = int(np.sum(t.to_arrow(columns=["value"])["value"].to_numpy()))
        _check(base.num_rows, total, ones, batch.num_rows, "supertable")
        superfiles = len(t.superfiles())
        shutil.rmtree(uri)
    return {"seconds": best, "io": io, "load_s": load_s, "superfiles": superfiles}


def bench_delta(root: str, base: pa.Table, batch: pa.Table, rounds: int):
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError:
        return None
    best = None
    for r in range(rounds):
        path = os.path.join(root, f"delta{r}")
        write_deltalake(path, base)
        dt = DeltaTable(path)
        t0 = time.perf_counter()
        (dt.merge(source=batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())
        took = time.perf_counter() - t0
        best = took if best is None else min(best, took)
        after = DeltaTable(path).to_pyarrow_table(columns=["value"])
        _check(base.num_rows, after.num_rows, int(np.sum(after["value"].to_numpy())),
               batch.num_rows, "delta-rs")
        shutil.rmtree(path)
    return best


def bench_lance(root: str, base: pa.Table, batch: pa.Table, rounds: int):
    try:
        import lancedb
    except ImportError:
        return None
    best = None
    for r in range(rounds):
        db = lancedb.connect(os.path.join(root, f"lance{r}"))
        tbl = db.create_table("t", base)
        t0 = time.perf_counter()
        (tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
         .execute(batch))
        took = time.perf_counter() - t0
        best = took if best is None else min(best, took)
        after = tbl.to_arrow()
        _check(base.num_rows, after.num_rows, int(np.sum(after["value"].to_numpy())),
               batch.num_rows, "lancedb")
        shutil.rmtree(os.path.join(root, f"lance{r}"))
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--upserts", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only-supertable", action="store_true",
                        help="skip delta-rs and LanceDB (for scale runs of the supertable)")
    args = parser.parse_args(argv)
    import pyarrow
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyarrow {pyarrow.__version__}, numpy {np.__version__}")
    base, batch = make_data(args.rows, args.upserts)
    print(f"table: {args.rows:,} rows (id int64, value int64, emb {DIM}-d float32); upsert: "
          f"{batch.num_rows:,} rows ({args.upserts // 2:,} existing keys, "
          f"{batch.num_rows - args.upserts // 2:,} new); best of {args.rounds}")
    root = tempfile.mkdtemp(prefix="upsert-table-bench-")
    try:
        ours = bench_supertable(root, base, batch, args.rounds)
        skip = args.only_supertable
        delta = None if skip else bench_delta(root, base, batch, args.rounds)
        lance = None if skip else bench_lance(root, base, batch, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    s = ours["seconds"]
    print(f"supertable upsert: {s:.3f} s ({batch.num_rows / s:,.0f} rows/s); read "
          f"{ours['io']['bytes']:,} bytes in {ours['io']['requests']} ranged reads to find "
          f"the keys; {ours['superfiles']} superfiles after; the initial append took "
          f"{ours['load_s']:.1f} s")
    for name, took in (("delta-rs merge (when_matched_update_all + when_not_matched_insert_all)",
                        delta),
                       ("LanceDB merge_insert (when_matched_update_all + "
                        "when_not_matched_insert_all)", lance)):
        if args.only_supertable:
            continue
        if took is None:
            print(f"{name}: not installed, skipped")
        else:
            print(f"{name}: {took:.3f} s; supertable / it = {s / took:.2f}x the time")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
