"""``python -m beam_supertable``: run as a real process on local disk and the S3 server."""

import datetime
import json
import os
import pathlib
import pty
import subprocess
import sys

import pyarrow as pa
import pytest

from beam_supertable import Supertable
from beam_supertable.cli import Progress, main, parse_bytes, parse_duration
from beam_supertable.table.inspection import inspect_table
from tests.beam_supertable.test_inspection import APPENDS, DELETED, build_known
from tests.conftest import s3_options

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cli(*args, cwd=None):
    """The CLI in a fresh interpreter, importing this checkout."""
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "beam_supertable", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_inspect_prints_a_summary_and_json_on_local_disk(tmp_path):
    uri = str(tmp_path / "t")
    build_known(uri)
    human = run_cli("inspect", uri)
    assert human.returncode == 0, human.stderr
    assert human.stderr == ""
    text = human.stdout
    live = sum(APPENDS) - DELETED
    for expected in (uri, "latest 4, 5 retained versions (oldest 0)",
                     f"{live:,} live, {DELETED} deleted", "3 holding",
                     "1 unreferenced object still in grace", "6h grace"):
        assert expected in text, (expected, text)

    as_json = run_cli("inspect", uri, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == inspect_table(uri)

    eager = run_cli("inspect", uri, "--json", "--older-than", "0s", "--retain-versions", "1")
    assert json.loads(eager.stdout)["vacuum"] == \
        inspect_table(uri, retain_versions=1, older_than=0)["vacuum"]


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    # ``inspect --json | head -3``: the pipe closes before the output is written.
    uri = str(tmp_path / "t")
    build_known(uri)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    read, write = os.pipe()
    os.close(read)   # nobody will ever read
    try:
        proc = subprocess.run([sys.executable, "-m", "beam_supertable", "inspect", uri, "--json"],
                              stdout=write, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=300)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr
    assert proc.returncode == 0


def test_vacuum_keeps_young_orphans_by_default_and_removes_them_with_no_grace(tmp_path):
    uri = str(tmp_path / "t")
    known = build_known(uri)
    orphan = tmp_path / "t" / known.orphan

    default = run_cli("vacuum", uri, "--json")   # no --older-than: the 6 h grace
    assert default.returncode == 0, default.stderr
    report = json.loads(default.stdout)
    assert report["removed_objects"] == [] and report["dry_run"] is False
    assert orphan.exists()

    dry = run_cli("vacuum", uri, "--older-than", "0s", "--retain-versions", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    # Versions 0-3 with their Iceberg metadata files (4) and manifest lists (3), the orphan.
    assert dry.stdout.startswith(f"{uri}: would remove 4 versions and 12 objects")
    assert orphan.exists() and Supertable.open(uri, version=0).version == 0

    done = run_cli("vacuum", uri, "--older-than", "0s", "--retain-versions", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["removed_versions"] == [0, 1, 2, 3]
    assert known.orphan in report["removed_objects"]
    assert report["retained_versions"] == [4]
    assert not orphan.exists()
    assert Supertable.open(uri).count_rows() == sum(APPENDS) - DELETED


@pytest.mark.s3
def test_inspect_and_vacuum_on_the_s3_server(s3_server, s3_bucket):
    uri, options = f"s3://{s3_bucket}/table", s3_options(s3_server)
    known = build_known(uri, options)
    flag = ("--storage-options", json.dumps(options))

    inspected = run_cli("inspect", uri, "--json", *flag)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout) == inspect_table(uri, options)

    dry = run_cli("vacuum", uri, "--json", "--dry-run", "--older-than", "0s", *flag)
    assert dry.returncode == 0, dry.stderr
    assert known.orphan in json.loads(dry.stdout)["removed_objects"]
    assert known.table.store.exists(known.orphan)

    done = run_cli("vacuum", uri, "--older-than", "0s", "--retain-versions", "2", *flag)
    assert done.returncode == 0, done.stderr
    assert "removed 3 versions" in done.stdout and "kept 2 versions (3-4)" in done.stdout
    assert not known.table.store.exists(known.orphan)
    assert Supertable.open(uri, storage_options=options).count_rows() == \
        sum(APPENDS) - DELETED


@pytest.mark.parametrize("args, status, names", [
    (["inspect", "{missing}"], 1, ["{missing}", "not a supertable"]),
    (["inspect", "{table}", "--storage-options", "{bad"], 2,
     ["--storage-options", "not valid JSON"]),
    (["vacuum", "{table}", "--older-than", "6 hours"], 2, ["--older-than", "'6 hours'"]),
])
def test_errors_exit_non_zero_with_one_line(tmp_path, args, status, names):
    table = str(tmp_path / "t")
    Supertable.create(table, pa.schema([("x", pa.int64())]))
    where = {"missing": str(tmp_path / "nothing-here"), "table": table}
    result = run_cli(*[a.format(**where) if a.startswith("{") and a[1:-1] in where else a
                       for a in args])
    assert result.returncode == status
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for name in names:
        assert name.format(**where) in result.stderr


def test_bad_arguments_name_the_argument(tmp_path, capsys):
    uri = str(tmp_path / "t")
    cases = [
        (["vacuum", uri, "--retain-versions", "0"], "--retain-versions"),
        (["inspect", uri, "--storage-options", "[1, 2]"], "must be a JSON object"),
        (["optimize", uri, "--target-file-bytes", "lots"], "--target-file-bytes"),
        (["optimize", uri, "--max-cell-rows", "-3"], "--max-cell-rows"),
        (["frobnicate", uri], "invalid choice"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_table_the_store_refuses_is_one_line_naming_it(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    # A path under a plain file: the store lists nothing there, so no table.
    assert main(["vacuum", str(blocker / "t"), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert str(blocker / "t") in err and len(err.strip().splitlines()) == 1


def test_parse_duration_and_bytes():
    assert parse_duration("6h") == datetime.timedelta(hours=6)
    assert parse_duration("30m") == datetime.timedelta(minutes=30)
    assert parse_duration("0s") == parse_duration("0") == datetime.timedelta(0)
    assert parse_duration("1h30m") == datetime.timedelta(minutes=90)
    assert parse_duration("1.5d") == datetime.timedelta(hours=36)
    assert parse_duration("2w") == datetime.timedelta(days=14)
    for bad in ("6", "6x", "h", "-1h", "1h 30m", "", "30m1h2"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    assert parse_bytes("67108864") == parse_bytes("64MiB") == parse_bytes("64 mib") == 64 << 20
    assert parse_bytes("1GB") == 10 ** 9
    for bad in ("0", "1.5GiB", "-5", "64 megs"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def _drawn_on_a_terminal(calls, clock):
    """What a Progress bar writes to a real pseudo-terminal for ``calls``."""
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w") as tty:
            bar = Progress(tty, "optimize", clock=clock)
            for done, total in calls:
                bar(done, total)
            bar.close()
        # One read returns what one write put in the pty, not all of it;
        # with the terminal side closed, read until Linux says EIO.
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
        return drawn.decode()
    finally:
        os.close(master)


def test_progress_draws_on_a_terminal_and_stays_silent_otherwise(tmp_path):
    ticks = iter(range(100))
    drawn = _drawn_on_a_terminal([(d, 4) for d in range(5)], lambda: float(next(ticks)))
    assert drawn.count("\roptimize [") == 5
    assert "0/4 (0%)" in drawn and "] 4/4 (100%)" in drawn and drawn.endswith("\n")
    # Calls closer together than the redraw interval draw only the last state.
    frozen = _drawn_on_a_terminal([(d, 4) for d in range(5)], lambda: 0.0)
    assert frozen.count("\roptimize [") == 2 and "1/4" not in frozen and "4/4" in frozen

    with open(tmp_path / "log", "w") as plain:   # a file, as stderr redirected
        bar = Progress(plain, "optimize")
        bar(1, 2)
        bar(2, 2)
        bar.close()
    assert (tmp_path / "log").read_text() == ""


def _small_commits_table(uri):
    import numpy as np
    schema = pa.schema([("k", pa.int64()), ("emb", pa.list_(pa.float32(), 8))])
    t = Supertable.create(uri, schema, vector_column="emb", n_cells=4)
    rng = np.random.default_rng(0)
    for i in range(6):
        x = rng.normal(size=(50, 8)).astype(np.float32)
        t.append(pa.table({"k": np.arange(i * 50, (i + 1) * 50),
                           "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8)}),
                 n_shards=1)
    import pyarrow.compute as pc
    t.delete(pc.field("k").isin(list(range(0, 300, 5))))
    return t


def test_optimize_dry_run_then_run_then_nothing_left(tmp_path):
    uri = str(tmp_path / "t")
    t = _small_commits_table(uri)
    before = inspect_table(uri)

    dry = run_cli("optimize", uri, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["plan"]
    for field in ("groups", "superfiles_to_rewrite", "rows_to_rewrite",
                  "deleted_rows_to_reclaim", "bytes_to_rewrite", "cells_to_split",
                  "estimated_superfiles_after"):
        assert field in plan
    assert plan["deleted_rows_to_reclaim"] == before["rows"]["deleted"]
    assert inspect_table(uri)["versions"]["latest"] == before["versions"]["latest"]

    done = run_cli("optimize", uri, "--json", "--target-file-bytes", "64MiB")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""    # no progress bar when stderr is not a terminal
    result = json.loads(done.stdout)
    assert result["optimized"] is True and result["version"] == before["versions"]["latest"] + 1
    after = inspect_table(uri)
    assert after["rows"]["live"] == before["rows"]["live"] and after["rows"]["deleted"] == 0
    assert after["superfiles"]["count"] < before["superfiles"]["count"]
    assert sorted(Supertable.open(uri).to_arrow()["_id"].to_pylist()) == \
        sorted(t.to_arrow()["_id"].to_pylist())

    again = run_cli("optimize", uri)
    assert again.returncode == 0, again.stderr
    assert "nothing to optimize" in again.stdout
    assert inspect_table(uri)["versions"]["latest"] == result["version"]

    vacuumed = run_cli("optimize", uri, "--vacuum-after", "--older-than", "0s",
                       "--retain-versions", "1", "--json")
    assert vacuumed.returncode == 0, vacuumed.stderr


def test_cli_on_a_store_without_credentials_is_one_line_no_traceback(tmp_path, s3_server):
    """A store client's own error (botocore's NoCredentialsError is no OSError) is one line.

    The CLI promises "errors are one line on stderr naming the URI ...
    without a traceback"; a missing credential printed a 30-line traceback.
    The process runs with no credentials anywhere it could find them.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    options = '{"client_kwargs": {"endpoint_url": "%s", "region_name": "us-east-1"}}' % s3_server
    result = subprocess.run(
        [sys.executable, "-m", "beam_supertable", "inspect", "s3://no-credentials/t",
         "--storage-options", options],
        capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "s3://no-credentials/t" in errors[0], result.stderr


def test_vacuum_token_retention_sets_the_table_property_and_inspect_shows_it(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1]}), token="a")
    done = run_cli("vacuum", uri, "--token-retention", "2h", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["token_horizon"] is not None
    assert Supertable.open(uri).token_retention == datetime.timedelta(hours=2)
    shown = run_cli("inspect", uri)
    assert shown.returncode == 0, shown.stderr
    assert "tokens      remembered 2h" in shown.stdout and "token markers 1" in shown.stdout
    bad = run_cli("vacuum", uri, "--token-retention", "0s")
    assert bad.returncode == 2 and "--token-retention: '0s': must be longer than 0" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
