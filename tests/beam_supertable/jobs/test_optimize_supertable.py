"""The optimize job: plan -> Reshuffle -> rewrite groups in parallel -> one commit.

The job's result must equal the local ``Supertable.optimize`` on a copy of the
same table: the same rows with the same ``_id`` s, no deleted rows left.
"""

import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import Supertable
from beam_supertable.jobs import flink, optimize_supertable

D = 8
SCHEMA = pa.schema([("n", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D))])


def _table(root, commits=12, rows=60):
    uri = str(root / "t")
    t = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"])
    rng = np.random.default_rng(0)
    for c in range(commits):
        x = rng.normal(size=(rows, D)).astype(np.float32)
        n = np.arange(c * rows, (c + 1) * rows)
        t.append(pa.table({"n": n, "body": [f"row {i}" for i in n],
                           "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), D)}))
    t.delete(pc.field("n").isin(list(range(0, commits * rows, 4))))
    return uri


def _copy(uri, root, name):
    dest = str(root / name)
    shutil.copytree(uri, dest)
    return dest


def _rows(uri):
    return Supertable.open(uri).to_arrow().sort_by("_id")


def _check_same_as_local(uri, root, argv):
    local = _copy(uri, root, "local")
    before = _rows(uri)
    version = Supertable.open(local).optimize(target_file_bytes=20_000, max_cell_rows=40)
    summary = optimize_supertable.run(
        ["--table", uri, "--target-file-bytes", "20000", "--max-cell-rows", "40"] + argv)
    assert summary["version"] == version
    assert summary["plan"]["cells_to_split"] > 0 and len(summary["plan"]["groups"]) > 1
    job, mine = Supertable.open(uri), Supertable.open(local)
    assert _rows(uri).equals(_rows(local)) and _rows(uri).equals(before)
    assert not job.snapshot.deletes and job.snapshot.totals == mine.snapshot.totals
    assert job.properties["grid"]["n_cells"] == mine.properties["grid"]["n_cells"]
    assert len(job.superfiles()) == len(mine.superfiles())
    return summary


def test_the_job_equals_local_optimize_and_a_rerun_does_nothing(tmp_path):
    uri = _table(tmp_path)
    summary = _check_same_as_local(uri, tmp_path, [])
    assert summary["counters"]["commits"] == 1
    assert summary["counters"]["groups_rewritten"] == len(summary["plan"]["groups"])
    version = Supertable.open(uri).version
    again = optimize_supertable.run(["--table", uri, "--target-file-bytes", "20000",
                                     "--max-cell-rows", "40"])
    assert again["version"] is None and Supertable.open(uri).version == version


def test_dry_run_writes_nothing(tmp_path, capsys):
    uri = _table(tmp_path, commits=3)
    version = Supertable.open(uri).version
    summary = optimize_supertable.run(["--table", uri, "--dry-run"])
    assert summary["version"] is None and summary["plan"]["superfiles_to_rewrite"] == 3
    assert Supertable.open(uri).version == version
    assert "dry run" in capsys.readouterr().out


def test_help_lists_the_jobs_options():
    out = subprocess.run([sys.executable, "-m", "pipelines.optimize_supertable", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--table", "--target-file-bytes", "--max-cell-rows", "--max-rewrite-bytes",
                 "--dry-run"):
        assert flag in out


@pytest.mark.flink
def test_the_job_on_flink_equals_local_optimize(tmp_path):
    jar = flink.job_server_jar()
    uri = _table(tmp_path)
    _check_same_as_local(uri, tmp_path, ["--runner=FlinkRunner", "--flink_master=[local]",
                                         "--parallelism=2", f"--flink_job_server_jar={jar}",
                                         "--environment_type=LOOPBACK"])
