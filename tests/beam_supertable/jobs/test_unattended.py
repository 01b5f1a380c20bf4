"""The jobs as an operator's scheduler runs them: real processes, exit statuses, one-line errors.

Every job runs as ``python -m pipelines.<job>`` from a scratch working
directory, the way the README shows it; what is checked is what a scheduler
sees (the exit status, stdout's summary, stderr's one line) and what is left
on disk (the table untouched, the dead letters kept).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from beam_supertable import Supertable

ROOT = pathlib.Path(__file__).resolve().parents[3]
JOBS = ("upsert_to_supertable", "load_supertable", "search_supertable", "optimize_supertable",
        "upsert_changes")
NOISE = ("Failed to import GCSFileSystem", "apitools not found", "Deleting 1 existing files",
         "Discarding unparseable args")


def job(name, *args, cwd, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", f"pipelines.{name}", *map(str, args)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def one_line_error(done, code=1):
    """The process failed with ``code`` and said why in one line, without a traceback."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def write_lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# -- strict flags ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", JOBS)
def test_a_misspelled_flag_stops_the_job_before_anything_runs(name, tmp_path):
    done = job(name, "--tabel", tmp_path / "x", cwd=tmp_path)
    line = one_line_error(done, code=2)
    assert "--tabel: unknown flag" in line
    if name != "upsert_changes":
        assert "did you mean --table?" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()


def test_the_main_job_refuses_a_flag_it_does_not_have(tmp_path):
    line = one_line_error(job("upsert_to_supertable", "--resume-at", "5", cwd=tmp_path), code=2)
    assert line.endswith("--resume-at: unknown flag; --help lists the job's flags")
    assert not (tmp_path / "out").exists()


def test_beam_runner_flags_keep_working(tmp_path):
    done = job("upsert_changes", "--runner=DirectRunner", "--direct_num_workers", "1",
               "--output", tmp_path / "c.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("upsert_changes: inserts=")


@pytest.mark.parametrize("name", JOBS)
def test_help_and_version_are_quiet_and_agree(name, tmp_path):
    done = job(name, "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "--version" in done.stdout and "--debug" in done.stdout
    assert "--max-invalid" in done.stdout or name == "optimize_supertable"
    if name != "upsert_changes":
        assert "--table URI" in done.stdout and "--storage-options JSON" in done.stdout
    version = job(name, "--version", cwd=tmp_path)
    assert version.returncode == 0 and "beam-upsert-supertable" in version.stdout


def test_sizes_are_written_the_same_way_as_in_the_command_line_tool(tmp_path):
    assert job("load_supertable", cwd=tmp_path).returncode == 0
    done = job("optimize_supertable", "--table", "out/chunks", "--dry-run",
               "--target-file-bytes", "64MiB", "--max-rewrite-bytes", "1GiB", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"target_file_bytes": 67108864' in done.stdout
    usage = job("optimize_supertable", "--help", cwd=tmp_path).stdout
    assert "usage:" in usage and "--table URI" in usage.split("\n\n")[0]   # required: no [ ]
    assert one_line_error(job("optimize_supertable", cwd=tmp_path), code=2).endswith(
        "the following arguments are required: --table")


# -- errors a user can act on ---------------------------------------------------------------------
def test_user_mistakes_are_one_line_and_write_nothing(tmp_path):
    (tmp_path / "afile").write_text("x")
    cases = [
        (("upsert_to_supertable", "--table", "afile"), "--table afile: is a file, not a table"),
        (("upsert_to_supertable", "--commands", "missing.jsonl"),
         "--commands missing.jsonl: no such file"),
        (("upsert_to_supertable", "--schema", "key:strng,reading:int64"),
         "--schema: column 'key' has unknown type 'strng'"),
        (("upsert_to_supertable", "--storage-options", "{not json"),
         "--storage-options: not valid JSON"),
        (("load_supertable", "--input", "nope/*.csv"), "--input nope/*.csv: no such file"),
        (("load_supertable", "--table", "afile"), "--table afile: is a file"),
    ]
    for args, expected in cases:
        line = one_line_error(job(*args, cwd=tmp_path))
        assert expected in line, (args, line)
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "afile").read_text() == "x"


def test_search_mistakes_name_the_column_or_the_missing_index(tmp_path):
    assert job("load_supertable", cwd=tmp_path).returncode == 0
    line = one_line_error(job("search_supertable", "--filter", "yeer >= 2010", cwd=tmp_path))
    assert "--filter: the table has no column 'yeer' (did you mean 'year'?)" in line
    assert job("upsert_to_supertable", cwd=tmp_path).returncode == 0
    line = one_line_error(job("search_supertable", "--table", "out/sensors", cwd=tmp_path))
    assert "no vector index and no text index" in line
    assert not (tmp_path / "out" / "search_results.jsonl").exists()


def test_debug_shows_the_traceback(tmp_path):
    done = job("upsert_to_supertable", "--commands", "missing.jsonl", "--debug", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("no such file (or no file matches "
                                                         "the pattern)")


# -- configuration mistakes never create a wrong table --------------------------------------------
@pytest.mark.parametrize("args, expected", [
    (("--primary-key", "nosuch"), "--primary-key nosuch: the commands' values have no column "
                                  "'nosuch'"),
    (("--primary-key", "unit"), "--primary-key unit: no command's value agrees with its key"),
    (("--schema", "key:string,readng:int64,unit:string"),
     "--schema: the values in .* hold column 'reading', which the schema lacks "
     "\\(did you mean 'readng'\\?\\)"),
])
def test_a_wrong_configuration_creates_no_table_and_records_no_frontier(args, expected,
                                                                        tmp_path):
    line = one_line_error(job("upsert_to_supertable", "--table", "t", *args, cwd=tmp_path))
    assert pytest.importorskip("re").search(expected, line), line
    assert not (tmp_path / "t").exists()


def test_an_upsert_onto_a_table_without_a_key_is_refused(tmp_path):
    assert job("load_supertable", cwd=tmp_path).returncode == 0
    before = Supertable.open(str(tmp_path / "out" / "chunks")).version
    line = one_line_error(job("upsert_to_supertable", "--table", "out/chunks", cwd=tmp_path))
    assert "the table has no primary key, and an upsert needs one" in line
    assert Supertable.open(str(tmp_path / "out" / "chunks")).version == before


def test_a_load_onto_a_table_of_another_schema_is_refused(tmp_path):
    assert job("upsert_to_supertable", cwd=tmp_path).returncode == 0
    line = one_line_error(job("load_supertable", "--table", "out/sensors", cwd=tmp_path))
    assert "has column 'id', which the table lacks" in line
    assert Supertable.open(str(tmp_path / "out" / "sensors")).version == 1


# -- exit statuses --------------------------------------------------------------------------------
def test_a_run_that_rejected_everything_exits_3_after_writing_its_summary(tmp_path):
    commands = write_lines(tmp_path / "bad.jsonl", [
        "not json", {"key": "a"}, {"offset": 1, "time": 1, "value": 3}])
    done = job("upsert_changes", "--commands", commands, "--output", tmp_path / "c.jsonl",
               cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "invalid=3" in done.stdout
    assert "every one of the 3 input records was rejected" in done.stderr
    assert len((tmp_path / "c.jsonl.invalid.jsonl").read_text().splitlines()) == 3


def test_max_invalid_takes_a_count_or_a_share(tmp_path):
    # The sample holds 242 commands, 7 of them rejected (2.9 %).
    done = job("upsert_to_supertable", "--table", "a", "--max-invalid", "5", cwd=tmp_path)
    assert done.returncode == 3 and "7 of 242 input records rejected" in done.stderr
    assert "invalid=7" in done.stdout and Supertable.open(str(tmp_path / "a")).version == 1
    assert job("upsert_to_supertable", "--table", "b", "--max-invalid", "3%",
               cwd=tmp_path).returncode == 0
    assert job("upsert_to_supertable", "--table", "c", "--max-invalid", "2.5%",
               cwd=tmp_path).returncode == 3
    assert job("upsert_to_supertable", "--max-invalid", "lots",
               cwd=tmp_path).returncode == 2


# -- dead letters and replay ----------------------------------------------------------------------
def test_a_rerun_keeps_the_dead_letters_of_earlier_runs(tmp_path):
    first = job("upsert_to_supertable", cwd=tmp_path)
    second = job("upsert_to_supertable", cwd=tmp_path)
    assert first.returncode == second.returncode == 0
    assert "(dead letters: out/sensors.invalid.jsonl)" in second.stdout
    records = [json.loads(line) for line in
               (tmp_path / "out" / "sensors.invalid.jsonl").read_text().splitlines()]
    assert len(records) == 14
    assert len({r["run"] for r in records}) == 2
    assert {r["version"] for r in records} == {1}
    assert all(set(r) == {"element", "reason", "run", "version"} for r in records)


def test_replay_applies_corrected_commands_unless_the_key_moved_on(tmp_path):
    schema = "key:string,reading:int64"
    first = write_lines(tmp_path / "first.jsonl", [
        {"key": "a", "offset": 1, "time": 100, "value": {"reading": "one"}},
        {"key": "b", "offset": 2, "time": 100, "value": {"reading": "two"}},
        {"key": "c", "offset": 3, "time": 100, "value": {"reading": 3}},
    ])
    later = write_lines(tmp_path / "later.jsonl", [
        {"key": "b", "offset": 9, "time": 200, "value": {"reading": 20}}])
    base = ("upsert_to_supertable", "--table", "t", "--schema", schema)
    assert job(*base, "--commands", first, cwd=tmp_path).returncode == 0
    assert job(*base, "--commands", later, cwd=tmp_path).returncode == 0
    table = Supertable.open(str(tmp_path / "t"))
    frontier = table.frontier
    # The operator corrects both rejected commands and replays them.
    fixed = []
    for line in (tmp_path / "t.invalid.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["element"]["value"]["reading"] = {"one": 1, "two": 2}[
            record["element"]["value"]["reading"]]
        fixed.append(record)
    replay = write_lines(tmp_path / "fixed.jsonl", fixed)
    done = job(*base, "--replay", replay, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "inserts=1" in done.stdout and "not_replayed=1" in done.stdout
    table = Supertable.open(str(tmp_path / "t"))
    rows = {r["key"]: r["reading"] for r in table.to_arrow(columns=["key", "reading"]).to_pylist()}
    assert rows == {"a": 1, "b": 20, "c": 3}   # b kept the newer command's row
    assert table.frontier == frontier + 1
    kept = [json.loads(line) for line in
            (tmp_path / "t.invalid.jsonl").read_text().splitlines()]
    assert len(kept) == 3   # the two first rejections, and b's refused replay
    assert "not replayed: key 'b' changed after version 1" in kept[-1]["reason"]
    # Replaying again (a scheduler's retry) changes nothing: a's replay landed already
    # (counted, not refused), b's is refused again.
    again = job(*base, "--replay", replay, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "not_replayed=1 already_applied=1" in again.stdout
    assert {r["key"]: r["reading"] for r in Supertable.open(str(tmp_path / "t")).to_arrow(
        columns=["key", "reading"]).to_pylist()} == rows


# -- reruns and quiet runs ------------------------------------------------------------------------
def test_rerunning_the_sample_load_commits_nothing_new(tmp_path):
    first = job("load_supertable", cwd=tmp_path)
    second = job("load_supertable", cwd=tmp_path)
    assert first.returncode == second.returncode == 0
    assert "rows=24" in first.stdout and "rows=0" in second.stdout
    assert Supertable.open(str(tmp_path / "out" / "chunks")).count_rows() == 24
    search = job("search_supertable", cwd=tmp_path)
    results = [json.loads(line)["results"] for line in
               (tmp_path / "out" / "search_results.jsonl").read_text().splitlines()]
    assert search.returncode == 0
    assert all(len({r["id"] for r in got}) == len(got) for got in results)


def test_a_sample_run_logs_nothing_but_our_own_warnings(tmp_path):
    done = job("upsert_changes", cwd=tmp_path)
    assert done.returncode == 0
    assert not any(noise in done.stderr for noise in NOISE), done.stderr
    verbose = job("upsert_changes", "--verbose", cwd=tmp_path)
    assert verbose.returncode == 0 and "Deleting 1 existing files" not in verbose.stdout


def test_the_changelog_encodes_values_and_errors_alike(tmp_path):
    assert job("upsert_changes", cwd=tmp_path).returncode == 0
    rows = [json.loads(line) for line in
            (tmp_path / "out" / "changes.jsonl").read_text().splitlines()]
    assert {"key", "value", "error", "diff", "time"} == set(rows[0])
    errors = [r for r in rows if r["error"] is not None]
    values = [r for r in rows if r["value"] is not None]
    assert errors and values
    assert all(r["value"] is None and isinstance(r["error"], str) for r in errors)
    assert all(isinstance(r["value"], dict) for r in values)


# -- nothing written where it would destroy or lose something ---------------------------------
@pytest.mark.parametrize("name", ["search_supertable", "upsert_changes"])
def test_an_output_naming_a_folder_is_refused_and_the_folder_kept(name, tmp_path):
    assert job("load_supertable", cwd=tmp_path).returncode == 0
    line = one_line_error(job(name, "--output", "out/chunks", cwd=tmp_path))
    assert "--output out/chunks: is a folder; name a file" in line
    assert Supertable.open(str(tmp_path / "out" / "chunks")).count_rows() == 24


def test_dead_letters_that_cannot_be_written_stop_the_job_before_it_commits(tmp_path):
    (tmp_path / "dl").mkdir()
    line = one_line_error(job("upsert_to_supertable", "--table", "t", "--dead-letters", "dl",
                              cwd=tmp_path))
    assert "--dead-letters dl: is a folder" in line
    line = one_line_error(job("upsert_to_supertable", "--table", "t", "--dead-letters",
                              "nosuch://x/dead.jsonl", cwd=tmp_path))
    assert "--dead-letters nosuch://x/dead.jsonl: no filesystem" in line
    assert not (tmp_path / "t").exists()


def test_a_schema_no_value_fits_creates_no_table_and_records_no_frontier(tmp_path):
    line = one_line_error(job("upsert_to_supertable", "--table", "t", "--schema",
                              "key:string,reading:float32[4],unit:string", cwd=tmp_path))
    assert "--schema: no value in" in line and "column 'reading' expects 4 float32" in line
    line = one_line_error(job("upsert_to_supertable", "--table", "t", "--text-columns",
                              "reading", cwd=tmp_path))
    assert "--text-columns reading: a text index needs a string column" in line
    assert not (tmp_path / "t").exists()


def test_a_replay_with_two_records_for_one_key_applies_the_higher_offset_and_says_so(tmp_path):
    schema = "key:string,reading:int64"
    first = write_lines(tmp_path / "first.jsonl", [
        {"key": "a", "offset": 1, "time": 100, "value": {"reading": "one"}},
        {"key": "a", "offset": 1, "time": 101, "value": {"reading": "uno"}},
        {"key": "c", "offset": 3, "time": 100, "value": {"reading": 3}}])
    base = ("upsert_to_supertable", "--table", "t", "--schema", schema)
    assert job(*base, "--commands", first, cwd=tmp_path).returncode == 0
    records = [json.loads(line) for line in (tmp_path / "t.invalid.jsonl").read_text()
               .splitlines()]
    assert len(records) == 2
    for offset, record in zip((5, 7), records):
        record["element"]["value"]["reading"] = offset
        record["element"]["offset"] = offset
    done = job(*base, "--replay", write_lines(tmp_path / "fix.jsonl", records), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "replayed=1 not_replayed=1" in done.stdout
    rows = Supertable.open(str(tmp_path / "t")).to_arrow(columns=["key", "reading"]).to_pylist()
    assert {r["key"]: r["reading"] for r in rows} == {"a": 7, "c": 3}
    last = json.loads((tmp_path / "t.invalid.jsonl").read_text().splitlines()[-1])
    assert last["element"]["offset"] == 5 and "higher offset" in last["reason"]


def test_a_flag_given_twice_is_refused(tmp_path):
    line = one_line_error(job("upsert_to_supertable", "--table", "t1", "--table=t2",
                              cwd=tmp_path), code=2)
    assert "--table: given twice" in line
    assert not (tmp_path / "t1").exists() and not (tmp_path / "t2").exists()
