"""The load job end to end: Parquet, JSON lines and CSV files into a supertable."""

import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_supertable import Supertable
from beam_supertable.jobs import flink, load_supertable
from beam_supertable.jobs.file_rows import format_of, parse_schema

SUMMARY = re.compile(r"^load_supertable: rows=(\d+) invalid=(\d+) commits=(\d+) version=(\d+) "
                     r"-> (\S+) \(dead letters: (\S+)\)$", re.MULTILINE)


def sample_rows():
    rows, bad = [], 0
    with open(load_supertable.DEFAULT_INPUT) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if len(row["embedding"]) != 32:
                bad += 1
                continue
            rows.append(row)
    return rows, bad


def dead_letters(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_the_sample_loads_with_its_dead_letters(tmp_path, capsys):
    table = str(tmp_path / "chunks")
    counts = load_supertable.run(["--table", table])
    rows, bad = sample_rows()
    summary = SUMMARY.search(capsys.readouterr().out)
    assert summary, "no summary line"
    assert summary.groups() == (str(len(rows)), str(bad), "1", "1", table,
                                table + ".invalid.jsonl")
    assert counts["rows_committed"] == len(rows) == 24 and counts["invalid"] == bad == 2
    t = Supertable.open(table)
    assert t.user_schema.field("embedding").type == pa.list_(pa.float32(), 32)
    assert t.user_schema.field("year").type == pa.int64()
    assert t.properties["vector"]["column"] == "embedding"
    assert t.properties["fts"]["columns"] == ["content"]
    assert sorted(t.to_arrow(columns=["id"])["id"].to_pylist()) == sorted(r["id"] for r in rows)
    # The nearest row to a row's own embedding is that row.
    target = rows[9]
    assert t.search(vector=target["embedding"], k=1, nprobe=100)["id"].to_pylist() == [target["id"]]
    letters = dead_letters(table + ".invalid.jsonl")
    reasons = sorted(letter["reason"] for letter in letters)
    assert "unparseable JSON" in reasons[0] and "chunks.jsonl" in reasons[0]
    assert reasons[1].startswith("row with id '") and \
        "column 'embedding' expects 32 float32 values, got " in reasons[1]


def test_parquet_files_with_an_inferred_schema(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 8))
    for part in range(2):  # a glob of two files, list<double> vectors
        sl = slice(part * 150, (part + 1) * 150)
        pq.write_table(pa.table({
            "n": pa.array(range(part * 150, (part + 1) * 150), pa.int64()),
            "body": [f"row {i} {'even' if i % 2 == 0 else 'odd'}" for i in range(300)][sl],
            "vec": pa.array(x[sl].tolist(), pa.list_(pa.float64())),
        }), tmp_path / f"part-{part}.parquet", row_group_size=50)
    table = str(tmp_path / "t")
    counts = load_supertable.run(["--input", str(tmp_path / "part-*.parquet"), "--table", table,
                                  "--vector-column", "vec", "--text-columns", "body",
                                  "--metric", "l2"])
    assert counts["rows_committed"] == 300 and counts["invalid"] == 0
    t = Supertable.open(table)
    assert t.user_schema.field("vec").type == pa.list_(pa.float32(), 8)
    assert t.search(vector=x[123], k=1, nprobe=100)["n"].to_pylist() == [123]
    assert t.search(text="row 77", k=1)["n"].to_pylist() == [77]
    assert dead_letters(table + ".invalid.jsonl") == []


def test_csv_with_typed_cells_nulls_and_bad_lines(tmp_path):
    csv_path = tmp_path / "docs.csv"
    csv_path.write_text(
        "id,title,year,score,vec\n"
        'a,"a title, with a comma",2001,0.5,"[1, 0, 0]"\n'
        "b,plain,,1.5,\"[0, 1, 0]\"\n"                # empty year: null
        "c,odd year,twenty,2.5,\"[0, 0, 1]\"\n"       # not an int: year is inferred text
        "d,short row,2004\n"                          # too few fields: a dead letter
        "e,\"two\nlines\",2005,3.5,\"[1, 1, 0]\"\n")  # a quoted newline is one cell
    table = str(tmp_path / "t")
    dead = str(tmp_path / "dead.jsonl")
    counts = load_supertable.run(["--input", str(csv_path), "--table", table,
                                  "--vector-column", "vec", "--text-columns", "title",
                                  "--dead-letters", dead])
    assert counts["rows_committed"] == 4 and counts["invalid"] == 1
    t = Supertable.open(table)
    assert t.user_schema.field("year").type == pa.string()  # "twenty" in the sample
    assert t.user_schema.field("score").type == pa.float64()
    rows = {r["id"]: r for r in t.to_arrow().to_pylist()}
    assert rows["a"]["title"] == "a title, with a comma" and rows["e"]["title"] == "two\nlines"
    assert rows["b"]["score"] == 1.5 and rows["e"]["vec"] == [1.0, 1.0, 0.0]
    (letter,) = dead_letters(dead)
    assert letter["reason"].endswith("docs.csv line 5: expected 5 fields, got 3")
    assert letter["element"] == ["d", "short row", "2004", None, None]


def test_a_given_schema_types_csv_cells(tmp_path):
    csv_path = tmp_path / "docs.csv"
    csv_path.write_text("id,year,vec\na,2001,\"[1, 0]\"\nb,,\"[0, 1]\"\nc,twenty,\"[1, 1]\"\n"
                        "d,2004,\"[1, 2, 3]\"\n")
    table, dead = str(tmp_path / "t"), str(tmp_path / "dead.jsonl")
    counts = load_supertable.run([
        "--input", str(csv_path), "--table", table, "--schema",
        "id:string,year:int64,vec:float32[2]", "--vector-column", "vec", "--dead-letters", dead])
    assert counts["rows_committed"] == 2
    t = Supertable.open(table)
    assert t.user_schema.equals(parse_schema("id:string,year:int64,vec:float32[2]"))
    assert sorted((r["id"], r["year"]) for r in t.to_arrow().to_pylist()) == [
        ("a", 2001), ("b", None)]
    reasons = sorted(d["reason"] for d in dead_letters(dead))
    assert reasons[0].startswith("column 'year'") and "twenty" in reasons[0]
    assert reasons[1] == "row with id 'd': column 'vec' expects 2 float32 values, got 3"


def test_an_existing_table_is_appended_to_and_a_job_id_loads_once(tmp_path):
    table = str(tmp_path / "t")
    first = load_supertable.run(["--table", table, "--job-id", "batch-1"])
    again = load_supertable.run(["--table", table, "--job-id", "batch-1"])
    assert first["version"] == again["version"] == 1
    assert Supertable.open(table).count_rows() == first["rows_committed"]
    other = load_supertable.run(["--table", table, "--job-id", "batch-2"])
    assert other["version"] == 2
    assert Supertable.open(table).count_rows() == 2 * first["rows_committed"]
    with pytest.raises(ValueError, match="--schema does not match the table"):
        load_supertable.run(["--table", table, "--schema", "id:string"])
    with pytest.raises(ValueError, match="the table at .* indexes 'embedding'"):
        load_supertable.run(["--table", table, "--vector-column", "vec"])


def test_settings_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown type 'text'"):
        parse_schema("id:string,body:text")
    with pytest.raises(ValueError, match="is not name:type"):
        parse_schema("id")
    with pytest.raises(ValueError, match="cannot tell the format"):
        format_of("data.txt")
    with pytest.raises(ValueError, match="--input .*: no such file"):
        load_supertable.run(["--input", str(tmp_path / "none-*.jsonl"),
                             "--table", str(tmp_path / "t")])
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"id": "a", "vec": [1, 2]}\n')
    with pytest.raises(ValueError, match="no vector column 'emb'"):
        load_supertable.run(["--input", str(jsonl), "--table", str(tmp_path / "t"),
                             "--vector-column", "emb"])


def test_help_lists_the_job_options():
    done = subprocess.run([sys.executable, "-m", "pipelines.load_supertable", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for flag in ("--input", "--format", "--table", "--schema", "--vector-column", "--metric",
                 "--text-columns", "--n-cells", "--n-shards", "--job-id", "--dead-letters"):
        assert flag in done.stdout


@pytest.fixture(scope="module")
def flink_jar():
    return flink.job_server_jar()


@pytest.mark.flink
def test_load_on_flink_equals_direct_runner(flink_jar, tmp_path):
    tables, letters = {}, {}
    for runner, extra in (("direct", []),
                          ("flink", ["--runner=FlinkRunner", "--flink_master=[local]",
                                     "--parallelism=2", f"--flink_job_server_jar={flink_jar}"])):
        table = str(tmp_path / runner / "chunks")
        counts = load_supertable.run(["--table", table] + extra)
        assert counts["rows_committed"] == 24 and counts["invalid"] == 2, runner
        rows = Supertable.open(table).to_arrow(columns=["id", "content", "embedding"]).to_pylist()
        tables[runner] = sorted((r["id"], r["content"], tuple(r["embedding"])) for r in rows)
        letters[runner] = sorted(d["reason"] for d in dead_letters(table + ".invalid.jsonl"))
    assert tables["flink"] == tables["direct"]
    assert letters["flink"] == letters["direct"]
