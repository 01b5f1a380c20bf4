"""``Supertable.upsert`` against delta-rs ``merge`` and LanceDB ``merge_insert``.

    python -m benchmarks.upsert_table_bench                  # 500,000 rows, 50,000 upserted
    python -m benchmarks.upsert_table_bench --rows 100000 --upserts 10000
    python -m benchmarks.upsert_table_bench --rows 5000000 --only-supertable   # scale
    python -m benchmarks.upsert_table_bench --sizes 100000,500000,1000000 --plot

A table of ``--rows`` rows (``id`` int64 key, ``value`` int64, ``emb`` 64-d
float32) on a local directory, then one upsert of ``--upserts`` rows: half
of them existing keys (drawn at random), half new keys. Each system gets the
same Arrow data in the same run; only the upsert call is timed (best of
``--rounds``, each on a fresh copy of the loaded table). The delta-rs and
LanceDB baselines run when ``deltalake`` / ``lancedb`` import, and the
output says so when they do not. ``--sizes`` runs several table sizes in
turn and ``--plot`` draws the time against the size to
``docs/img/upsert-table.png``.
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


def run(rows: int, upserts: int, rounds: int, only_supertable: bool) -> dict:
    """One table size: every system's best upsert time (None where skipped), printed."""
    base, batch = make_data(rows, upserts)
    print(f"table: {rows:,} rows (id int64, value int64, emb {DIM}-d float32); upsert: "
          f"{batch.num_rows:,} rows ({upserts // 2:,} existing keys, "
          f"{batch.num_rows - upserts // 2:,} new); best of {rounds}")
    root = tempfile.mkdtemp(prefix="upsert-table-bench-")
    try:
        ours = bench_supertable(root, base, batch, rounds)
        delta = None if only_supertable else bench_delta(root, base, batch, rounds)
        lance = None if only_supertable else bench_lance(root, base, batch, rounds)
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
        if only_supertable:
            continue
        if took is None:
            print(f"{name}: not installed, skipped")
        else:
            print(f"{name}: {took:.3f} s; supertable / it = {s / took:.2f}x the time")
    sys.stdout.flush()
    return {"supertable": s, "delta-rs": delta, "lancedb": lance}


def plot(sizes, results, upserts: int, rounds: int) -> str:
    from benchmarks import plots
    series = []
    for label, key in (("ours (Supertable.upsert)", "supertable"),
                       ("LanceDB merge_insert", "lancedb"), ("delta-rs MERGE", "delta-rs")):
        points = [(n, r[key]) for n, r in zip(sizes, results) if r[key] is not None]
        if points:
            series.append((label, [n for n, _ in points], [t for _, t in points]))
    return plots.draw("upsert-table", [("", series)], xlabel="table rows",
                      ylabel=f"upsert of {upserts:,} rows, s (best of {rounds})",
                      title="Keyed merge time against table size", xlog=True, ylog=True,
                      note=plots.machine_note())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--sizes", default="",
                        help="table sizes to run one after the other, e.g. 100000,500000 "
                             "(instead of --rows)")
    parser.add_argument("--upserts", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only-supertable", action="store_true",
                        help="skip delta-rs and LanceDB (for scale runs of the supertable)")
    parser.add_argument("--plot", action="store_true",
                        help="draw docs/img/upsert-table.png (needs matplotlib)")
    args = parser.parse_args(argv)
    import pyarrow
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyarrow {pyarrow.__version__}, numpy {np.__version__}")
    sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else [args.rows]
    results = [run(n, args.upserts, args.rounds, args.only_supertable) for n in sizes]
    if args.plot:
        print(f"chart: {plot(sizes, results, args.upserts, args.rounds)}")

if __name__ == "__main__":
    main()
