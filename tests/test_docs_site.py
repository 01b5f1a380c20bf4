"""The documentation: the mkdocs site builds in strict mode, and the README stays a front page."""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
README_MAX_LINES = 260
QUICK_START = "./scripts/run-main\n./scripts/test\n"


def test_the_site_builds_in_strict_mode(tmp_path):
    # Not skipped when the tools are missing: the test command installs the
    # docs extra, and a site nobody builds breaks unnoticed.
    for tool in ("mkdocs", "mkdocstrings", "material"):
        try:
            __import__(tool)
        except ImportError as exc:
            pytest.fail(f"{tool} is missing ({exc}): install the docs extra, pip install -e '.[docs]'")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"mkdocs build --strict failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    assert (tmp_path / "index.html").exists()
    api = (tmp_path / "api" / "transforms" / "index.html").read_text(encoding="utf-8")
    for name in ("WriteToSupertable", "ReadFromSupertable", "UpsertToSupertable"):
        assert f'id="beam_supertable.{name}"' in api, f"{name} is missing from the API reference"


def test_the_readme_is_short_with_the_quick_start_first_and_no_outside_paths():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    section = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section is not None, "README.md has no '## Quick start' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), re.S | re.M)
    assert block is not None, "the Quick start has no fenced block"
    assert block.group(1) == QUICK_START, f"first Quick start block: {block.group(1)!r}"
    assert "../shared" not in text


# -- the commands the documentation shows ---------------------------------------------------------
JOB_COMMANDS = {
    "python -m pipelines.upsert_to_supertable": "upsert_to_supertable",
    "./scripts/run-main": "upsert_to_supertable",
    "beam-supertable-upsert": "upsert_to_supertable",
    "python -m pipelines.load_supertable": "load_supertable",
    "beam-supertable-load": "load_supertable",
    "python -m pipelines.search_supertable": "search_supertable",
    "beam-supertable-search": "search_supertable",
    "python -m pipelines.optimize_supertable": "optimize_supertable",
    "beam-supertable-optimize": "optimize_supertable",
    "python -m pipelines.upsert_changes": "upsert_changes",
    "beam-upsert-changes": "upsert_changes",
}
CLI_COMMANDS = ("python -m beam_supertable", ".venv/bin/python -m beam_supertable",
                ".venv/bin/beam-supertable", "beam-supertable")
DOC_PAGES = [README] + [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
                        for f in fs if f.endswith(".md")]


def _shown_commands():
    """Each command line of a fenced block in the docs, continuation lines joined."""
    for page in DOC_PAGES:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                yield os.path.relpath(page, ROOT), line


def _flags(parser):
    return {s for a in parser._actions for s in a.option_strings}


def test_every_flag_the_docs_show_is_a_flag_of_that_command():
    import importlib

    from beam_supertable import cli
    from beam_supertable.jobs import options

    beam_flags = _flags(options._beam_parser())
    checked, wrong = 0, []
    for page, line in _shown_commands():
        prefix, job = next(((p, j) for p, j in JOB_COMMANDS.items()
                            if line.startswith(p + " ") or line == p), (None, None))
        if job is not None:
            known = _flags(importlib.import_module(f"beam_supertable.jobs.{job}").build_parser())
            known |= beam_flags
        elif line.startswith(CLI_COMMANDS):
            prefix = next(p for p in CLI_COMMANDS if line.startswith(p))
            parser = cli.build_parser()
            known = _flags(parser)
            for word in line[len(prefix):].split():   # down the (nested) subcommands
                choices = [a.choices for a in parser._actions
                           if isinstance(a, argparse._SubParsersAction)]
                if not choices or word not in choices[0]:
                    continue
                parser = choices[0][word]
                known |= _flags(parser)
        else:
            continue
        checked += 1
        words = [w.strip("[]") for w in shlex.split(line[len(prefix):])]
        for flag in (w.split("=")[0] for w in words if w.startswith("-")):
            if flag not in known:
                wrong.append(f"{page}: {flag} in {line!r}")
    assert checked >= 15, checked
    assert not wrong, "\n".join(wrong)


def _job(name, *args, cwd):
    done = subprocess.run([sys.executable, "-m", f"pipelines.{name}", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _page(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def test_the_summary_lines_the_docs_show_are_what_the_sample_jobs_print(tmp_path):
    """The quick start's two lines, and the jobs guide's lines for the sample runs."""
    first, second = (_job("upsert_to_supertable", cwd=tmp_path) for _ in range(2))
    for page in ("README.md", "docs/getting-started.md", "docs/guides/jobs-and-cli.md"):
        for line in ((first, second) if page != "docs/guides/jobs-and-cli.md" else (first,)):
            assert line in _page(page), f"{page} does not show {line!r}"
    guide = _page("docs", "guides", "jobs-and-cli.md")
    printed = [_job("load_supertable", cwd=tmp_path), _job("load_supertable", cwd=tmp_path),
               _job("search_supertable", cwd=tmp_path),
               _job("search_supertable", "--filter", 'topic == "space" and year >= 2010',
                    cwd=tmp_path)]

    # The replay the guide walks through: a rejected command, corrected in its record.
    with open(tmp_path / "out" / "sensors.invalid.jsonl", encoding="utf-8") as f:
        record = json.loads(next(line for line in f if "sensor-03" in line))
    record["element"] = {"key": "sensor-03", "value": {"reading": 12}, "offset": 99,
                         "time": 1767225600}
    (tmp_path / "fix.jsonl").write_text(json.dumps(record) + "\n")
    printed.append(_job("upsert_to_supertable", "--replay", "fix.jsonl", cwd=tmp_path))
    for line in printed:
        assert line in guide, f"docs/guides/jobs-and-cli.md does not show {line!r}"
