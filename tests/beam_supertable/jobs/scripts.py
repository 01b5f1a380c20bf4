"""Runs command lines through the console scripts' own functions, several in one process.

Input (stdin): a JSON list of ``[script, arg, ...]``; output (stdout): a JSON list of
``{"code", "stdout", "stderr"}``, one per command line, in order. Each command line
runs as its installed console script does: ``sys.argv`` set, then the function
``pyproject.toml`` names called; its exit status is what it returns (or exits with).
One process saves the interpreter's and Beam's start for every command line.
"""

import contextlib
import io
import json
import sys

from beam_supertable import cli
from beam_supertable.jobs import _launch

SCRIPTS = {
    "beam-supertable": cli.main,
    "beam-supertable-load": _launch.load_supertable,
    "beam-supertable-upsert": _launch.upsert_to_supertable,
    "beam-supertable-search": _launch.search_supertable,
    "beam-supertable-optimize": _launch.optimize_supertable,
    "beam-upsert-changes": _launch.upsert_changes,
}


def run_one(script, args):
    sys.argv = [script, *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = SCRIPTS[script]()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main():
    results = [run_one(line[0], line[1:]) for line in json.load(sys.stdin)]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
