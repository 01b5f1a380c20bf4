"""Every fenced Python block of the README and the docs runs as written.

A page's blocks run in order in one process and one namespace (a later block may use
what an earlier one made, as a reader goes down the page), in a fresh working folder.
A block that cannot run here says so on its first line, visibly in the page:
``# not run here: <why>`` (it needs a cloud account or a cluster); such blocks are
compiled, not run. New pages are picked up by the glob.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RUN = "# not run here:"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?:python|py)(?:\s.*)?$")
PAGE_TIMEOUT_S = 300

# Runs one page's blocks: argv[1] a JSON list of [line, code, run]; prints a JSON result.
_RUNNER = r'''
import json, sys, traceback
blocks = json.loads(sys.argv[1])
namespace = {"__name__": "__main__"}
for line, code, run in blocks:
    try:
        compiled = compile(code, f"block at line {line}", "exec")
        if run:
            exec(compiled, namespace)
    except BaseException as exc:
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        print(json.dumps({"line": line, "error": "".join(lines[-6:])}))
        sys.exit(0)
print(json.dumps({"line": None}))
'''


def pages():
    found = [os.path.join(ROOT, "README.md")]
    found += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [os.path.relpath(p, ROOT) for p in found]


def blocks(path):
    """``(first line number, code, run)`` of each fenced Python block of the page."""
    out, current, start, indent = [], None, 0, ""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if current is None:
                match = _FENCE.match(line)
                if match:
                    current, start, indent = [], number + 1, match.group("indent")
            elif line.strip() == "```":
                code = "".join(current)
                run = not code.lstrip().startswith(NOT_RUN)
                out.append((start, code, run))
                current = None
            else:
                current.append(line[len(indent):] if line.startswith(indent) else line)
    return out


def run_page(path, folder):
    todo = blocks(path)
    # The blocks' temporary folders go under the page's own folder, removed with it.
    env = {**os.environ, "PYTHONPATH": ROOT, "TMPDIR": str(folder)}
    done = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(todo)], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    try:
        result = json.loads(last)
    except ValueError:
        result = {"line": "?", "error": f"exit {done.returncode}: {done.stderr[-2000:]}"}
    return result


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    todo = [p for p in pages() if blocks(p)]
    folders = {p: tmp_path_factory.mktemp(re.sub(r"\W", "_", p)) for p in todo}
    with ThreadPoolExecutor(max_workers=2) as pool:
        got = dict(zip(todo, pool.map(lambda p: run_page(p, folders[p]), todo)))
    return got


@pytest.mark.parametrize("path", pages())
def test_the_python_blocks_of_the_page_run_as_written(path, results):
    if path not in results:
        return   # no Python block on this page
    result = results[path]
    assert result["line"] is None, f"{path}, the block at line {result['line']}:\n" \
                                   f"{result['error']}"


def test_blocks_not_run_are_few_and_say_why():
    skipped = [(p, line) for p in pages() for line, code, run in blocks(p) if not run]
    for path, line in skipped:
        code = next(c for n, c, _ in blocks(path) if n == line)
        assert len(code.splitlines()[0]) > len(NOT_RUN) + 5, (path, line)
    total = sum(len(blocks(p)) for p in pages())
    assert len(skipped) <= max(3, total // 5), skipped


if __name__ == "__main__":   # python tests/test_docs_snippets.py PAGE...: run pages here
    import tempfile
    for page in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as scratch:
            print(page, json.dumps(run_page(page, scratch), indent=1))
