"""The documentation: the mkdocs site builds in strict mode, and the README stays a front page."""

import os
import re
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
