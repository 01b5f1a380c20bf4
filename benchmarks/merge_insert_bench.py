"""``Supertable.merge_insert`` with all three clauses against delta-rs ``merge``.

    python -m benchmarks.merge_insert_bench                  # 200,000 rows, 20,000 merged
    python -m benchmarks.merge_insert_bench --rows 500000 --upserts 50000

The table and source of ``upsert_table_bench`` (``id`` int64 key, ``value``
int64, ``emb`` 64-d float32; the source: half existing keys, half new, all
with ``value`` 1), merged with the same three clauses in both systems:

- when matched, update all where ``source.value > target.value`` (every match);
- when not matched, insert all;
- when not matched by source, delete where ``target.id < rows / 10``.

Both run in the same process, interleaved round by round (supertable, then
delta-rs, each on a fresh copy of the loaded table); only the merge call is
timed, best of ``--rounds``. The result is checked against the expected row
count in both. delta-rs runs when ``deltalake`` imports; the output says so
when it does not.
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
import pyarrow.compute as pc

from beam_supertable import Supertable
from benchmarks.upsert_table_bench import DIM, make_data


def expected(base: pa.Table, batch: pa.Table, cut: int) -> tuple:
    """(rows after, inserted, updated, deleted) of the three clauses."""
    ids = base["id"].to_numpy()
    src = batch["id"].to_numpy()
    matched = np.isin(src, ids)
    deleted = int(np.sum((ids < cut) & ~np.isin(ids, src)))
    inserted = int(np.sum(~matched))
    return base.num_rows + inserted - deleted, inserted, int(np.sum(matched)), deleted


def merge_supertable(root: str, base: pa.Table, batch: pa.Table, cut: int, r: int) -> tuple:
    uri = os.path.join(root, f"st{r}")
    t = Supertable.create(uri, base.schema, vector_column="emb", primary_key="id")
    t.append(base)
    t = Supertable.open(uri)            # a cold handle: nothing cached
    t0 = time.perf_counter()
    result = (t.merge_insert("id")
              .when_matched_update_all(where=pc.field("source.value") > pc.field("target.value"))
              .when_not_matched_insert_all()
              .when_not_matched_by_source_delete(where=pc.field("id") < cut)
              .execute(batch))
    took = time.perf_counter() - t0
    counts = (Supertable.open(uri).count_rows(), result.num_inserted_rows,
              result.num_updated_rows, result.num_deleted_rows)
    shutil.rmtree(uri)
    return took, counts


def merge_delta(root: str, base: pa.Table, batch: pa.Table, cut: int, r: int):
    from deltalake import DeltaTable, write_deltalake
    path = os.path.join(root, f"delta{r}")
    write_deltalake(path, base)
    dt = DeltaTable(path)
    t0 = time.perf_counter()
    metrics = (dt.merge(source=batch, predicate="t.id = s.id", source_alias="s",
                        target_alias="t")
               .when_matched_update_all(predicate="s.value > t.value")
               .when_not_matched_insert_all()
               .when_not_matched_by_source_delete(predicate=f"t.id < {cut}")
               .execute())
    took = time.perf_counter() - t0
    counts = (DeltaTable(path).to_pyarrow_table(columns=["id"]).num_rows,
              metrics["num_target_rows_inserted"], metrics["num_target_rows_updated"],
              metrics["num_target_rows_deleted"])
    shutil.rmtree(path)
    return took, counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--upserts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        import deltalake
    except ImportError:
        deltalake = None
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyarrow {pa.__version__}, deltalake "
          f"{deltalake.__version__ if deltalake else 'not installed (skipped)'}")
    base, batch = make_data(args.rows, args.upserts)
    cut = args.rows // 10
    want = expected(base, batch, cut)
    print(f"table: {args.rows:,} rows (id int64, value int64, emb {DIM}-d float32); source: "
          f"{batch.num_rows:,} rows; expected: {want[1]:,} inserted, {want[2]:,} updated, "
          f"{want[3]:,} deleted; best of {args.rounds}, interleaved")
    root = tempfile.mkdtemp(prefix="merge-insert-bench-")
    times = {"supertable": [], "delta-rs": []}
    try:
        for r in range(args.rounds):
            took, counts = merge_supertable(root, base, batch, cut, r)
            if counts != want:
                raise AssertionError(f"supertable: {counts}, expected {want}")
            times["supertable"].append(took)
            if deltalake is not None:
                took, counts = merge_delta(root, base, batch, cut, r)
                if tuple(counts) != want:
                    raise AssertionError(f"delta-rs: {counts}, expected {want}")
                times["delta-rs"].append(took)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours = min(times["supertable"])
    print(f"supertable merge_insert (3 clauses): {ours:.3f} s (rounds: "
          f"{', '.join(f'{x:.3f}' for x in times['supertable'])})")
    if times["delta-rs"]:
        theirs = min(times["delta-rs"])
        print(f"delta-rs merge (3 clauses): {theirs:.3f} s (rounds: "
              f"{', '.join(f'{x:.3f}' for x in times['delta-rs'])}); supertable / it = "
              f"{ours / theirs:.2f}x the time")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
