"""Figures of the fault-proxy suite, for the README.

    python -m benchmarks.fault_proxy_report           # every scenario, the slow ones too
    python -m benchmarks.fault_proxy_report --fast    # only the scenarios CI runs by default

Runs the random-fault scenarios of ``tests/beam_supertable/test_fault_proxy.py``
(a TCP proxy between the clients and the S3-protocol server refuses, resets,
truncates and stalls a seeded share of the requests) and prints, per
scenario, the requests the proxy saw, the requests it faulted (by kind),
the commits that landed, and the duplicates and lost commits, which are 0
whenever this prints: the tests fail otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "tests/beam_supertable/test_fault_proxy.py"
SCENARIOS = "through_faults or never_answer or high_fault_share"
LINE = re.compile(r"^fault-proxy (\w+): (.*)$")
COLUMNS = ("scenario", "share", "requests", "faulted", "refuse", "reset", "truncate", "stall",
           "commits_landed", "runs", "right", "clear_errors", "duplicates", "lost", "wrong",
           "referenced_missing")


def parse(output: str) -> list:
    """The ``fault-proxy <scenario>: name value, ...`` lines the tests print."""
    rows = []
    for line in output.splitlines():
        match = LINE.match(line.strip())
        if match:
            row = {"scenario": match.group(1)}
            for pair in match.group(2).split(", "):
                name, _, value = pair.rpartition(" ")
                row[name] = value
            rows.append(row)
    return rows


def table(rows: list) -> str:
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    total = {c: sum(int(r[c]) for r in rows if r.get(c, "").isdigit()) for c in columns[2:]}
    out.append("| all | | " + " | ".join(str(total[c]) for c in columns[2:]) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="skip the slow scenarios")
    args = parser.parse_args(argv)
    marks = "s3 and not slow" if args.fast else "s3"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", marks,
         "-k", SCENARIOS, TESTS], cwd=ROOT, capture_output=True, text=True)
    rows = parse(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-3000:])
        print(f"the fault-proxy suite failed (exit {proc.returncode}); no figures", file=sys.stderr)
        return proc.returncode
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
