"""A table that runs for a long time: 10,000 tokened commits through the table API.

    python -m benchmarks.soak_bench                     # 10,000 commits, with and without
    python -m benchmarks.soak_bench --commits 2000 --every 200

Each commit appends 3 rows under its own token (``slot-<i>``), on a table with
``token_retention`` of one hour whose clock (``Manifest.clock``) moves one second per
commit, as a streaming writer committing once a second would see it; the soak spans
10,000 s, so the token horizon passes most of it. With maintenance, every ``--every``
commits run ``optimize()`` and ``vacuum(retain_versions=1, older_than=0)``; the versions
retained before the last round are checked first. Reported:
objects and metadata bytes by kind at the end, the most objects seen right after a
maintenance round and right before one, commit p50/p99 over the first and the last
``--every`` commits; then checks: every retained version holds the rows it should, a
rerun of a commit inside the horizon is deduplicated (its version vacuumed: found in
the token index), a rerun of one past the horizon is committed again.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time

import numpy as np
import pyarrow as pa

from beam_supertable import Supertable
from beam_supertable.format.manifest import Manifest
from beam_supertable.table.inspection import inspect_table

SCHEMA = pa.schema([("slot", pa.int64()), ("x", pa.int64())])
RETENTION_S = 3600
ROWS = 3


class _Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self, _manifest=None) -> float:
        return self.now


def _rows(i: int) -> pa.Table:
    return pa.table({"slot": [i] * ROWS, "x": list(range(i * ROWS, (i + 1) * ROWS))},
                    schema=SCHEMA)


def _objects(uri: str) -> dict:
    report = inspect_table(uri, older_than=0, retain_versions=1)
    kinds = report["storage"]["by_kind"]
    data = ("superfiles", "deletion_vectors")
    return {"objects": report["storage"]["objects"], "bytes": report["storage"]["bytes"],
            "metadata_objects": sum(k["objects"] for n, k in kinds.items() if n not in data),
            "metadata_bytes": sum(k["bytes"] for n, k in kinds.items() if n not in data),
            "by_kind": kinds, "tokens": report["tokens"]}


def _count(uri: str) -> int:
    return inspect_table(uri, older_than=0, retain_versions=1)["storage"]["objects"]


def soak(uri: str, commits: int, every: int, maintain: bool) -> dict:
    clock = _Clock(time.time())
    Manifest.clock = clock   # every handle of this process reads this clock
    t = Supertable.create(uri, SCHEMA, token_retention=RETENTION_S)
    times = []
    after, before = [], []
    expected = {t.version: 0}
    for i in range(commits):
        clock.now += 1
        t0 = time.perf_counter()
        v = t.append(_rows(i), token=f"slot-{i}")
        times.append(time.perf_counter() - t0)
        expected[v] = (i + 1) * ROWS
        if not maintain and i + 1 == commits:
            wrong = _wrong_versions(t, expected)
        if maintain and (i + 1) % every == 0:
            if i + 1 == commits:
                wrong = _wrong_versions(t, expected)   # the last stretch, before it goes
            before.append(_count(uri))
            t.optimize()
            t.vacuum(retain_versions=1, older_than=0)
            expected[t.version] = (i + 1) * ROWS
            after.append(_count(uri))
    first, last = np.array(times[:every]) * 1e3, np.array(times[-every:]) * 1e3
    out = {"commits": commits, "maintenance": maintain, **_objects(uri),
           "max_objects_after_maintenance": max(after, default=None),
           "max_objects_before_maintenance": max(before, default=None),
           "commit_ms": {"start": [float(np.percentile(first, 50)),
                                   float(np.percentile(first, 99))],
                         "end": [float(np.percentile(last, 50)),
                                 float(np.percentile(last, 99))]}}
    out["checks"] = _checks(uri, commits, wrong)
    return out


def _wrong_versions(t: Supertable, expected: dict) -> dict:
    """Every retained version's row count, and the rows of twenty of them."""
    retained = [h["version"] for h in t.history()]
    wrong = [v for v in retained if t.checkout(v).count_rows() != expected[v]]
    for v in retained[:: max(1, len(retained) // 20)] + retained[-1:]:
        got = t.checkout(v).to_arrow(columns=["x"]).column("x").to_pylist()
        if sorted(got) != list(range(expected[v])):
            wrong.append(v)
    return {"retained_versions": len(retained), "wrong_versions": sorted(set(wrong))}


def _checks(uri: str, commits: int, wrong: dict) -> dict:
    latest = Supertable.open(uri)
    inside = commits - min(RETENTION_S, commits) // 2    # half a horizon ago
    landed = latest.version
    latest.append(_rows(inside), token=f"slot-{inside}")
    deduplicated = latest.snapshot.deduplicated and Supertable.open(uri).version == landed
    past = Supertable.open(uri)
    v = past.append(_rows(0), token="slot-0")   # `commits` seconds ago
    committed_again = not past.snapshot.deduplicated and v == landed + 1
    if commits <= RETENTION_S:
        committed_again = None   # slot 0 is still inside the horizon: nothing to check
    return {**wrong, "rerun_inside_deduplicated": deduplicated,
            "rerun_past_committed_again": committed_again}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=500)
    args = parser.parse_args()
    print(f"# soak: {args.commits} commits, maintenance every {args.every}; "
          f"{platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for maintain in (True, False):
        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            result = soak(f"{folder}/t", args.commits, args.every, maintain)
            result["seconds"] = round(time.perf_counter() - started, 1)
            print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
