"""Schema changes: ``add_columns`` commit time by table size, and a full read before and after.

    python -m benchmarks.schema_bench                     # 1,000 and 1,000,000 rows
    python -m benchmarks.schema_bench --rows 1000 100000  # other sizes

For each size: a local table of that many rows (int64 key, float64, a
20-character string; superfiles of about 64 MiB), then ``add_columns`` of one
nullable column timed over ``--repeats`` commits (each a new column), and a
full ``to_arrow()`` before and after the changes (the new columns read null
in every old superfile). Prints one JSON object per size.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

from beam_supertable import Supertable

BATCH = 250_000


def _table(path: str, rows: int) -> Supertable:
    schema = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
    t = Supertable.create(path, schema)
    rng = np.random.default_rng(0)
    for start in range(0, rows, BATCH):
        n = min(BATCH, rows - start)
        t.append(pa.table({"k": np.arange(start, start + n), "x": rng.normal(size=n),
                           "s": pa.array([f"row-{i:016d}" for i in range(start, start + n)])}))
    return t


def _read_s(t: Supertable) -> float:
    fresh = Supertable.open(t.uri)     # a cold handle: nothing cached
    begin = time.perf_counter()
    got = fresh.to_arrow()
    took = time.perf_counter() - begin
    assert got.num_rows == t.count_rows()
    return took


def run(rows: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t = _table(f"{tmp}/t", rows)
        before = min(_read_s(t) for _ in range(3))
        commits = []
        for i in range(repeats):
            begin = time.perf_counter()
            t.add_columns(pa.field(f"c{i}", pa.string()))
            commits.append(time.perf_counter() - begin)
        after = min(_read_s(t) for _ in range(3))
        return {"rows": rows, "superfiles": len(t.superfiles()), "add_columns_commits": repeats,
                "commit_ms_p50": round(statistics.median(commits) * 1e3, 2),
                "commit_ms_max": round(max(commits) * 1e3, 2),
                "read_before_s": round(before, 3), "read_after_s": round(after, 3),
                "columns_after": len(t.schema) - 1}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    print(json.dumps({"machine": platform.machine(), "python": platform.python_version()}))
    for rows in args.rows:
        print(json.dumps(run(rows, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
