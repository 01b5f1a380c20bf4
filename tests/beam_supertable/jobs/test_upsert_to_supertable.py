"""The upsert_to_supertable job end to end: commands -> a keyed supertable, rerun-safe."""

import json
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_supertable import Supertable
from beam_supertable.jobs import flink, upsert_to_supertable
from beam_supertable.jobs.io_formats import parse_time
from beam_upsert.model import KeyState, apply_times

SUMMARY = re.compile(
    r"^upsert_to_supertable: inserts=(\d+) updates=(\d+) deletes=(\d+) dropped=(\d+) "
    r"invalid=(\d+) frontier=(\d+) version=(\d+) -> (\S+)", re.MULTILINE)


def reference(path, names=("key",)):
    """The final table by the shared per-key rule, from the command file itself."""
    by_key, usable, greatest = {}, 0, None
    with open(path) as f:
        for line in f:
            try:
                c = json.loads(line)
            except ValueError:
                continue
            if not {"key", "offset", "time"} <= set(c) or c.get("error") is not None:
                continue
            usable += 1
            key = tuple(c["key"]) if isinstance(c["key"], list) else c["key"]
            value = c.get("value")
            if value is not None:
                value = upsert_to_supertable.with_key(value, key, list(names))
            micros = parse_time(c["time"]).micros
            greatest = micros if greatest is None else max(greatest, micros)
            by_key.setdefault(key, []).append((micros, c["offset"], value))
    final = {k: apply_times(KeyState(), cmds, key=k).state.value for k, cmds in by_key.items()}
    rows = sorted((v for v in final.values() if v is not None), key=lambda r: r[names[0]])
    return rows, usable, greatest


def table_rows(uri, columns):
    return sorted(Supertable.open(uri).to_arrow(columns=columns).to_pylist(),
                  key=lambda r: r[columns[0]])


def test_the_sample_applies_once_and_a_rerun_changes_nothing(tmp_path, capsys):
    table = str(tmp_path / "sensors")
    expected, usable, greatest = reference(upsert_to_supertable.DEFAULT_COMMANDS)
    first = upsert_to_supertable.run(["--table", table])
    line = SUMMARY.search(capsys.readouterr().out)
    assert line, "no summary line"
    inserts, updates, deletes, dropped, invalid, frontier, version = map(int, line.groups()[:7])
    assert (dropped, invalid, version) == (0, 7, 1)
    assert frontier == greatest + 1 == first["frontier"]
    assert inserts - deletes == len(expected) and updates > 0
    assert table_rows(table, ["key", "reading", "unit"]) == expected
    with open(table + ".invalid.jsonl") as f:
        letters = [json.loads(x) for x in f]
    assert len(letters) == 7 and all(d["reason"] for d in letters)
    assert sum("instead of a value" in d["reason"] for d in letters) == 5

    second = upsert_to_supertable.run(["--table", table])
    line = SUMMARY.search(capsys.readouterr().out)
    assert tuple(map(int, line.groups()[:7])) == (0, 0, 0, usable, 7, frontier, 1)
    assert second["version"] == 1
    assert table_rows(table, ["key", "reading", "unit"]) == expected


def test_parquet_commands_with_a_schema_and_a_later_batch(tmp_path):
    table = str(tmp_path / "docs")

    def write(path, commands):
        value_type = pa.struct([("id", pa.int64()), ("body", pa.string()),
                                ("emb", pa.list_(pa.float32()))])
        pq.write_table(pa.table({
            "key": pa.array([c[0] for c in commands], pa.int64()),
            "offset": pa.array([c[1] for c in commands], pa.int64()),
            "time": pa.array([c[2] for c in commands], pa.float64()),
            "value": pa.array([c[3] for c in commands], value_type)}), path)

    def doc(i, body):
        return {"id": i, "body": body, "emb": [float(i), 1.0, 0.0]}

    write(tmp_path / "a.parquet", [(i, i, 100.0, doc(i, f"first {i}")) for i in range(20)])
    write(tmp_path / "b.parquet", [(1, 50, 200.0, None), (2, 51, 200.0, doc(2, "second 2")),
                                   (3, 52, 50.0, doc(3, "too old"))])
    args = ["--table", table, "--primary-key", "id", "--schema",
            "id:int64,body:string,emb:float32[3]", "--vector-column", "emb",
            "--text-columns", "body"]
    a = upsert_to_supertable.run(args + ["--commands", str(tmp_path / "a.parquet")])
    assert (a["inserts"], a["version"], a["frontier"]) == (20, 1, 100_000_001)
    b = upsert_to_supertable.run(args + ["--commands", str(tmp_path / "b.parquet")])
    assert (b.get("inserts", 0), b["updates"], b["deletes"], b["dropped"]) == (0, 1, 1, 1)
    assert (b["version"], b["frontier"]) == (2, 200_000_001)
    t = Supertable.open(table)
    rows = {r["id"]: r["body"] for r in t.to_arrow(columns=["id", "body"]).to_pylist()}
    assert len(rows) == 19 and 1 not in rows and rows[2] == "second 2" and rows[3] == "first 3"
    assert t.search(text="second", k=1, columns=["id"])["id"].to_pylist() == [2]


def test_help_lists_the_job_options():
    out = subprocess.run([sys.executable, "-m", "pipelines.upsert_to_supertable", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--commands", "--table", "--primary-key", "--schema", "--storage-options"):
        assert flag in out.stdout


@pytest.fixture(scope="module")
def flink_jar():
    return flink.job_server_jar()


@pytest.mark.flink
def test_upsert_on_flink_equals_direct_runner(flink_jar, tmp_path):
    tables = {}
    for runner, extra in (("direct", []),
                          ("flink", ["--runner=FlinkRunner", "--flink_master=[local]",
                                     "--parallelism=2", f"--flink_job_server_jar={flink_jar}"])):
        table = str(tmp_path / runner / "sensors")
        counts = upsert_to_supertable.run(["--table", table] + extra)
        assert counts["version"] == 1, runner
        again = upsert_to_supertable.run(["--table", table] + extra)
        assert again["version"] == 1, runner
        tables[runner] = (table_rows(table, ["key", "reading", "unit"]),
                          Supertable.open(table).frontier)
    assert tables["flink"] == tables["direct"]


def test_a_corrupt_parquet_command_file_is_an_error_naming_it(tmp_path):
    """Inferring the schema from a file that is no Parquet raised pyarrow's
    "Parquet magic bytes not found", naming no file; nothing is created."""
    bad = tmp_path / "commands.parquet"
    bad.write_bytes(b"not parquet at all")
    table = tmp_path / "t"
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        upsert_to_supertable.run(["--commands", str(bad), "--table", str(table)])
    assert not table.exists()


@pytest.mark.flink
def test_upsert_with_schema_mode_merge_on_flink_equals_direct_runner(flink_jar, tmp_path):
    """``--schema-mode merge`` on Flink: a command bringing a new column adds it
    (one schema commit) and lands its value; the rows equal the DirectRunner's."""
    def write(name, commands):
        path = tmp_path / name
        path.write_text("".join(json.dumps(c) + "\n" for c in commands))
        return str(path)

    first = write("a.jsonl", [{"key": f"s{i}", "offset": i, "time": 100 + i,
                               "value": {"id": f"s{i}", "reading": i}} for i in range(4)])
    second = write("b.jsonl", [{"key": "s1", "offset": 10, "time": 200,
                                "value": {"id": "s1", "reading": 10, "unit": "C"}},
                               {"key": "s9", "offset": 11, "time": 201,
                                "value": {"id": "s9", "reading": 9, "unit": "F"}}])
    tables = {}
    for runner, extra in (("direct", []),
                          ("flink", ["--runner=FlinkRunner", "--flink_master=[local]",
                                     "--parallelism=2", f"--flink_job_server_jar={flink_jar}"])):
        table = str(tmp_path / runner / "sensors")
        upsert_to_supertable.run(["--commands", first, "--table", table, "--primary-key", "id"]
                                 + extra)
        upsert_to_supertable.run(["--commands", second, "--table", table,
                                  "--schema-mode", "merge"] + extra)
        t = Supertable.open(table)
        assert t.schema.names[-1] == "unit", runner
        tables[runner] = t.to_arrow(columns=["id", "reading", "unit"]).sort_by("id").to_pylist()
    assert tables["flink"] == tables["direct"]
    assert {r["id"]: r["unit"] for r in tables["flink"]} == {
        "s0": None, "s1": "C", "s2": None, "s3": None, "s9": "F"}
