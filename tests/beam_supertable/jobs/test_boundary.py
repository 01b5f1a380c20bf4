"""Mistakes a new user makes at the jobs' and the command line's boundary, through the
console scripts: each one is refused before anything is written, in one line naming the
flag, or does what the user meant.

The command lines run in order in one process (``scripts.py``), as a scheduler would
run them one after another: the later ones find the tables the earlier ones made.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import subprocess
import sys

import pytest

from beam_supertable import Supertable

ROOT = pathlib.Path(__file__).resolve().parents[3]
HERE = pathlib.Path(__file__).resolve().parent
NOISE = ("Failed to import GCSFileSystem", "apitools not found", "Deleting 1 existing files")
VECTORS = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.9, 0.1, 0.1, 0.1],
           [0.1, 0.9, 0.1, 0.1], [0.1, 0.1, 0.9, 0.1], [0.1, 0.1, 0.1, 0.9]]
SCHEMA_8 = "id:int64,emb:float32[8],topic:string,body:string"
REPLAY_SCHEMA = "key:string,reading:int64"

# name -> the command line; run in this order.
CASES = {
    "wrong_dimension": ["beam-supertable-load", "--input", "rows.jsonl", "--table", "t_wrong",
                        "--schema", SCHEMA_8, "--vector-column", "emb"],
    "load": ["beam-supertable-load", "--input", "rows.jsonl", "--table", "t",
             "--vector-column", "emb", "--text-columns", "body"],
    "schema_differs": ["beam-supertable-load", "--input", "rows.jsonl", "--table", "t",
                       "--schema", SCHEMA_8],
    "csv_holding_json": ["beam-supertable-load", "--input", "json.csv", "--table", "t_csv"],
    "jsonl_holding_csv": ["beam-supertable-load", "--input", "csv.jsonl", "--table", "t_csv"],
    "upsert_jsonl_holding_csv": ["beam-supertable-upsert", "--commands", "csv.jsonl",
                                 "--table", "t_csv"],
    "changes_jsonl_holding_csv": ["beam-upsert-changes", "--commands", "csv.jsonl",
                                  "--output", "changes/c.jsonl"],
    "search_csv_holding_json": ["beam-supertable-search", "--queries", "json.csv",
                                "--table", "t"],
    "empty_into_table": ["beam-supertable-load", "--input", "empty.jsonl", "--table", "t"],
    "empty_with_schema": ["beam-supertable-load", "--input", "empty.jsonl", "--table",
                          "t_empty", "--schema", "id:int64,body:string"],
    "empty_new_table": ["beam-supertable-load", "--input", "empty.jsonl", "--table", "t_none"],
    "gzip_load": ["beam-supertable-load", "--input", "rows.jsonl.gz", "--table", "t_gz",
                  "--vector-column", "emb"],
    "gzip_csv_holding_json": ["beam-supertable-load", "--input", "json.csv.gz", "--table",
                              "t_csv"],
    "gzip_upsert": ["beam-supertable-upsert", "--commands", "first.jsonl.gz", "--table", "k_gz",
                    "--schema", "key:string,reading:string"],
    "bare_glob": ["beam-supertable-load", "--input", "row*.jsonl", "--table", "t_glob"],
    "filter_types": ["beam-supertable-search", "--queries", "queries.jsonl", "--table", "t",
                     "--filter", "topic == 5", "--output", "res/out.jsonl"],
    "cli_afile_inspect": ["beam-supertable", "inspect", "--table", "afile"],
    "cli_afile_vacuum": ["beam-supertable", "vacuum", "--table", "afile"],
    "cli_afile_sync": ["beam-supertable", "iceberg", "sync", "--table", "afile"],
    "inside_a_file": ["beam-supertable-load", "--input", "rows.jsonl", "--table", "afile/t"],
    "cli_inside_a_file": ["beam-supertable", "inspect", "--table", "afile/t"],
    "cli_blank_table": ["beam-supertable", "inspect", "--table", " "],
    "cli_misspelled": ["beam-supertable", "inspect", "--tabel", "t"],
    "cli_misspelled_sync": ["beam-supertable", "iceberg", "sync", "--tabel", "t"],
    "cli_spec_two_jobs": ["beam-supertable", "template-spec", "beam-supertable-load", "b"],
    "cli_table_twice": ["beam-supertable", "vacuum", "--table", "t", "--table=t2"],
    "cli_help": ["beam-supertable", "inspect", "--help"],
    "cli_storage_options": ["beam-supertable", "inspect", "--table", "t",
                            "--storage-options", '{"nosuch_option": 1}'],
    "changes_into_folder": ["beam-upsert-changes", "--output", "changes/dir/"],
    "changes_as_csv": ["beam-upsert-changes", "--output", "changes/x.csv"],
    "optimize_help": ["beam-supertable-optimize", "--help"],
    "local_storage_options": ["beam-supertable-optimize", "--table", "t",
                              "--storage-options", '{"nosuch_option": 1}'],
    "memory_storage_options": ["beam-supertable-search", "--table", "memory://t",
                               "--storage-options", '{"nosuch_option": 1}'],
    "misspelled_runner": ["beam-upsert-changes", "--output", "changes/c.jsonl",
                          "--runner", "DirectRuner"],
    "negative_max_invalid": ["beam-supertable-load", "--max-invalid", "-5%"],
    "replay_first": ["beam-supertable-upsert", "--commands", "first.jsonl", "--table", "k",
                     "--schema", REPLAY_SCHEMA],
    "replay": ["beam-supertable-upsert", "--replay", "fixed.jsonl", "--table", "k"],
    "replay_again": ["beam-supertable-upsert", "--replay", "fixed.jsonl", "--table", "k"],
}
JOB_SCRIPTS = ("beam-supertable-load", "beam-supertable-upsert", "beam-supertable-search",
               "beam-supertable-optimize")
for _script in JOB_SCRIPTS:
    for _blank in ("", " "):
        CASES[f"blank_table {_script} {_blank!r}"] = [_script, "--table", _blank]


def _lines(path: pathlib.Path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _write_replay(folder: pathlib.Path) -> None:
    """Corrects the first run's rejected command for ``a`` and keeps ``c``'s (still wrong),
    each element written by hand as the commands file had it."""
    fixed = []
    for line in (folder / "k.invalid.jsonl").read_text().splitlines():
        record = json.loads(line)
        key = record["element"]["key"]
        record["element"] = {"key": key, "offset": 1, "time": 100,
                             "value": {"reading": 1 if key == "a" else "still bad"}}
        fixed.append(record)
    _lines(folder / "fixed.jsonl", fixed)


def _run(folder: pathlib.Path, names):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    done = subprocess.run([sys.executable, str(HERE / "scripts.py")], cwd=folder, env=env,
                          input=json.dumps([CASES[n] for n in names]), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return dict(zip(names, json.loads(done.stdout)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("boundary")
    rows = [{"id": i, "emb": v, "topic": f"t{i % 2}", "body": f"hello world {i}"}
            for i, v in enumerate(VECTORS)]
    _lines(folder / "rows.jsonl", rows)
    _lines(folder / "json.csv", rows)
    (folder / "csv.jsonl").write_text("id,body\n1,hello\n")
    for name in ("rows.jsonl", "json.csv"):
        (folder / f"{name}.gz").write_bytes(gzip.compress((folder / name).read_bytes()))
    (folder / "empty.jsonl").write_text("")
    (folder / "afile").write_text("x")
    _lines(folder / "queries.jsonl", [{"id": "q", "text": "hello"}])
    _lines(folder / "first.jsonl", [
        {"key": "a", "offset": 1, "time": 100, "value": {"reading": "one"}},
        {"key": "c", "offset": 1, "time": 100, "value": {"reading": "three"}},
        {"key": "d", "offset": 1, "time": 100, "value": {"reading": 4}}])
    (folder / "first.jsonl.gz").write_bytes(gzip.compress((folder / "first.jsonl").read_bytes()))
    names = list(CASES)
    first = names[:names.index("replay")]
    got = _run(folder, first)
    _write_replay(folder)
    got.update(_run(folder, names[len(first):]))
    return folder, got


def _one_line(result, code=1) -> str:
    assert result["code"] == code, result
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result["stderr"], result["stderr"]
    return lines[0]


def test_a_schema_no_row_fits_creates_no_table_and_a_differing_one_names_the_types(runs):
    folder, got = runs
    line = _one_line(got["wrong_dimension"])
    assert "--schema: no row of rows.jsonl fits the new table's columns" in line
    assert "column 'emb' expects 8 float32 values, got 4" in line
    assert not (folder / "t_wrong").exists()
    assert got["load"]["code"] == 0, got["load"]
    line = _one_line(got["schema_differs"])
    assert "column 'emb' is 4 float32 values in the table, 8 float32 values in --schema" in line


def test_a_file_holding_another_format_is_named_as_it_looks(runs):
    folder, got = runs
    assert _one_line(got["csv_holding_json"]).endswith(
        "--input json.csv: read as CSV, but it looks like JSON lines; pass --format jsonl "
        "or rename the file")
    assert "--input csv.jsonl: read as JSON lines, but it looks like CSV; pass --format csv" \
        in _one_line(got["jsonl_holding_csv"])
    for name, flag in (("upsert_jsonl_holding_csv", "--commands"),
                       ("changes_jsonl_holding_csv", "--commands")):
        assert f"{flag} csv.jsonl: read as JSON lines, but it looks like CSV" in \
            _one_line(got[name])
    assert "--queries json.csv: read as CSV, but it looks like JSON lines" in \
        _one_line(got["search_csv_holding_json"])
    assert not (folder / "t_csv").exists() and not (folder / "changes").exists()


def test_compressed_inputs_are_read_decompressed_and_a_bare_glob_matches(runs):
    folder, got = runs
    for name, table, rows in (("gzip_load", "t_gz", len(VECTORS)), ("gzip_upsert", "k_gz", 2),
                              ("bare_glob", "t_glob", len(VECTORS))):
        assert got[name]["code"] == 0, got[name]
        assert Supertable.open(str(folder / table)).count_rows() == rows
    assert "--input json.csv.gz: read as CSV, but it looks like JSON lines" in \
        _one_line(got["gzip_csv_holding_json"])


def test_an_empty_input_is_a_run_that_loads_nothing(runs):
    folder, got = runs
    for name in ("empty_into_table", "empty_with_schema"):
        assert got[name]["code"] == 0, got[name]
        assert "rows=0 invalid=0" in got[name]["stdout"]
    assert Supertable.open(str(folder / "t")).count_rows() == len(VECTORS)
    line = _one_line(got["empty_new_table"])
    assert line.endswith("--input empty.jsonl: no rows to infer a schema from; pass --schema")


def test_a_filter_comparing_across_types_is_refused_before_the_pipeline(runs):
    folder, got = runs
    line = _one_line(got["filter_types"])
    assert "--filter: column 'topic' is string, the value 5 is int64" in line
    assert not (folder / "res").exists()
    assert not [n for n in os.listdir(folder) if n.startswith("beam-temp")]


def test_an_empty_table_path_is_the_same_line_in_every_job(runs):
    folder, got = runs
    for script in JOB_SCRIPTS:
        for blank in ("", " "):
            assert _one_line(got[f"blank_table {script} {blank!r}"]).endswith(
                "error: --table: empty path")
    assert _one_line(got["cli_blank_table"]).endswith("inspect: error: --table: empty path")
    assert not (folder / " ").exists() and not (folder / "out").exists()


def test_the_command_line_says_a_file_is_no_table_and_names_the_flag_meant(runs):
    folder, got = runs
    for name, command in (("cli_afile_inspect", "inspect"), ("cli_afile_vacuum", "vacuum"),
                          ("cli_afile_sync", "iceberg sync")):
        assert _one_line(got[name]).endswith(
            f"{command}: error: --table afile: is a file, not a table (a table is a folder)")
    assert (folder / "afile").read_text() == "x"
    assert _one_line(got["inside_a_file"]).endswith(
        "error: --table afile/t: afile is a file, so no table can be inside it")
    assert _one_line(got["cli_inside_a_file"]).endswith(
        "inspect: error: --table afile/t: afile is a file, so no table can be inside it")
    for name, command in (("cli_misspelled", "inspect"), ("cli_misspelled_sync", "iceberg sync")):
        assert _one_line(got[name], code=2).endswith(
            f"{command}: error: --tabel: unknown flag; did you mean --table?")
    assert _one_line(got["cli_spec_two_jobs"], code=2).endswith(
        "template-spec: error: 'b': unexpected argument")
    assert _one_line(got["cli_table_twice"], code=2).endswith(
        "vacuum: error: --table: given twice; give it once")
    help_text = got["cli_help"]["stdout"]
    assert got["cli_help"]["code"] == 0 and "inspect [-h] [--table URI]" in help_text
    assert "positional arguments:\n  URI " in help_text


def test_an_output_that_is_a_folder_or_not_json_lines_is_refused_up_front(runs):
    folder, got = runs
    assert "--output changes/dir/: names a folder (it ends with /); name a file" in \
        _one_line(got["changes_into_folder"])
    assert "--output changes/x.csv: the job writes JSON lines (.jsonl) or Parquet (.parquet), " \
           "not csv" in _one_line(got["changes_as_csv"])
    assert not (folder / "changes").exists()


def test_a_replay_that_landed_is_a_no_op_and_a_record_keeps_its_shape(runs):
    folder, got = runs
    assert got["replay_first"]["code"] == 0, got["replay_first"]
    assert got["replay"]["code"] == 0, got["replay"]
    again = got["replay_again"]
    assert again["code"] == 0, again
    assert "already_applied=1" in again["stdout"]
    rows = Supertable.open(str(folder / "k")).to_arrow(columns=["key", "reading"]).to_pylist()
    assert {r["key"]: r["reading"] for r in rows} == {"a": 1, "d": 4}
    fixed = {json.loads(line)["element"]["key"]: json.loads(line)["element"]
             for line in (folder / "fixed.jsonl").read_text().splitlines()}
    records = [json.loads(line) for line in (folder / "k.invalid.jsonl").read_text().splitlines()]
    again_c = [r["element"] for r in records[2:] if r["element"]["key"] == "c"]
    assert again_c and all(element == fixed["c"] for element in again_c)


def test_smaller_flag_mistakes_are_usage_errors_or_one_line(runs):
    _, got = runs
    optimize_help = got["optimize_help"]["stdout"]
    assert got["optimize_help"]["code"] == 0
    assert "--max-invalid" not in optimize_help and "3 more input" not in optimize_help
    assert "--storage-options: 'nosuch_option' is not an option of a local table" in \
        _one_line(got["local_storage_options"])
    assert "--storage-options: 'nosuch_option' is not an option of a memory:// table" in \
        _one_line(got["memory_storage_options"])
    assert "inspect: error: --storage-options: 'nosuch_option'" in \
        _one_line(got["cli_storage_options"])
    assert "--runner DirectRuner: not a runner Beam knows; did you mean DirectRunner?" in \
        _one_line(got["misspelled_runner"], code=2)
    assert "argument --max-invalid/--max_invalid: '-5%': expected a count" in \
        _one_line(got["negative_max_invalid"], code=2)


# -- the examples ---------------------------------------------------------------------------------
def _example(name, *args, cwd, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_an_example_given_k_0_is_a_usage_error(tmp_path):
    done = _example("rag_pipeline", "--k", "0", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("argument --k: '0': must be >= 1")
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_the_change_feed_example_says_where_it_works_leaves_nothing_and_is_quiet(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = _example("change_feed", cwd=tmp_path, env={"TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"tables in {scratch}")
    assert "nearest to 'sourdough starter yeast': bread" in done.stdout
    assert not any(noise in done.stderr for noise in NOISE), done.stderr
    assert not [n for n in os.listdir(scratch) if n.startswith("change-feed-")]
