"""The main job, end to end on the shipped sample, as a user runs it."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from beam_supertable.jobs import upsert_changes
from tests.beam_upsert.reference import reference_upsert


def _sample_reference(resume_at=None):
    commands, bad = [], 0
    with open(upsert_changes.DEFAULT_COMMANDS) as f:
        for line in f:
            try:
                row = json.loads(line)
                value = ("ERR", row["error"]) if row.get("error") else (
                    json.dumps(row["value"], sort_keys=True) if isinstance(row.get("value"), dict)
                    else row.get("value"))
                commands.append((row["key"], value, row["offset"], row["time"]))
            except (ValueError, KeyError):
                bad += 1
    with open(upsert_changes.DEFAULT_PRIOR) as f:
        prior = [(r["key"], json.dumps(r["value"], sort_keys=True)) for r in map(json.loads, f)]
    return reference_upsert(commands, prior, resume_at), bad, len(prior)


@pytest.mark.parametrize("flavor", ["grouped", "stateful"])
def test_default_sample_run_matches_the_reference(tmp_path, flavor):
    out = tmp_path / "changes.jsonl"
    counts = upsert_changes.run(["--output", str(out), "--flavor", flavor])
    expected, bad, n_prior = _sample_reference()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(expected)
    assert sum(r["diff"] for r in rows) == sum(e[2] for e in expected)
    assert counts["unparseable"] == bad == 2
    assert counts["rehydrated"] == n_prior
    inserts = sum(1 for r in rows if r["diff"] == 1)
    assert counts.get("inserts", 0) + counts.get("updates", 0) == inserts
    invalid = (tmp_path / "changes.jsonl.invalid.jsonl").read_text().splitlines()
    assert len(invalid) == 2 and all("reason" in json.loads(i) for i in invalid)


def test_parquet_output_and_resume_at(tmp_path):
    out = tmp_path / "changes.parquet"
    resume = 1767225600 + 4 * 60
    counts = upsert_changes.run(["--output", str(out), "--resume-at", str(resume)])
    expected, _, _ = _sample_reference(resume_at=resume)
    table = pq.read_table(out)
    assert table.num_rows == len(expected)
    assert counts["dropped_before_resume"] > 0


def test_help_lists_the_job_options():
    done = subprocess.run([sys.executable, "-m", "pipelines.upsert_changes", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for flag in ("--commands", "--prior", "--resume-at", "--output", "--flavor"):
        assert flag in done.stdout
