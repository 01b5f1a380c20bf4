"""The search job end to end: a file of queries -> top-k rows per query."""

import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from beam_supertable.jobs import flink, load_supertable, search_supertable
from beam_supertable.jobs.search_supertable import parse_filter
from tests.beam_supertable.jobs.outputs import job_outputs

SUMMARY = re.compile(r"^search_supertable: queries=(\d+) results=(\d+) empty=(\d+) invalid=(\d+) "
                     r"-> (\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def sample():
    rows = []
    with open(load_supertable.DEFAULT_INPUT) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if len(row["embedding"]) == 32:
                rows.append(row)
    return rows


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("search") / "chunks")
    load_supertable.run(["--table", uri, "--metric", "cosine"])
    return uri


def results(path):
    with open(path) as f:
        return {r["id"]: r for r in map(json.loads, f)}


def nearest(sample, vector, k, where=lambda r: True):
    """(cosine distance, id) of the k nearest sample rows, by brute force."""
    q = np.asarray(vector) / np.linalg.norm(vector)
    scored = []
    for r in sample:
        if where(r):
            x = np.asarray(r["embedding"])
            scored.append((float(1 - q @ x / np.linalg.norm(x)), r["id"]))
    return sorted(scored)[:k]


def test_the_sample_queries(table, sample, tmp_path, capsys):
    out = str(tmp_path / "results.jsonl")
    counts = search_supertable.run(["--table", table, "--output", out, "--nprobe", "100"])
    summary = SUMMARY.search(capsys.readouterr().out)
    assert summary and summary.groups() == ("4", str(counts["results"]), "0", "1", out)
    got = results(out)
    assert sorted(got) == ["q-animals", "q-hybrid", "q-text", "q-vector"]
    with open(search_supertable.DEFAULT_QUERIES) as f:
        queries = {q["id"]: q for q in map(json.loads, f)}
    # Vector: the true nearest rows, nearest first, with their distances.
    vec = got["q-vector"]
    assert vec["mode"] == "vector"
    want = nearest(sample, queries["q-vector"]["vector"], 3)
    np.testing.assert_allclose([r["distance"] for r in vec["results"]], [d for d, _ in want],
                               atol=1e-5)
    assert vec["results"][0]["id"] == want[0][1] == "oceans-18"
    # Text: the kitten sentence holds the most query words.
    assert got["q-animals"]["mode"] == "text"
    assert got["q-animals"]["results"][0]["content"] == "Kittens learn to hunt by playing"
    # Hybrid: the row both rankings put first leads.
    hybrid = got["q-hybrid"]
    assert hybrid["mode"] == "hybrid" and hybrid["results"][0]["id"] == "space-06"
    assert {"_distance", "_score"} <= set(hybrid["results"][0])
    columns = {"id", "distance", "content", "topic", "year"}
    assert all(set(r) == columns | {"_score"} for r in got["q-text"]["results"])
    assert all(set(r) == columns | {"_distance"} for r in vec["results"])
    (bad,) = [json.loads(line) for line in open(out + ".invalid.jsonl")]
    assert bad["reason"] == "query 'q-bad': expected 32 numbers, got 3"


def test_filter_columns_and_batching(table, sample, tmp_path):
    queries = tmp_path / "q.jsonl"
    rng = np.random.default_rng(2)
    asks = [{"id": f"q{i}", "vector": rng.normal(size=32).tolist()} for i in range(30)]
    queries.write_text("\n".join(map(json.dumps, asks)) + "\n")
    outputs = []
    for batch in ("1", "100"):
        out = str(tmp_path / f"out-{batch}.jsonl")
        search_supertable.run([
            "--table", table, "--queries", str(queries), "--output", out, "--k", "4",
            "--nprobe", "100", "--batch-size", batch, "--columns", "topic",
            "--filter", 'topic == "space" and year >= 2008'])
        outputs.append(results(out))
    assert outputs[0] == outputs[1]
    for ask in asks:
        got = outputs[0][ask["id"]]["results"]
        want = nearest(sample, ask["vector"], 4,
                       lambda r: r["topic"] == "space" and r["year"] >= 2008)
        np.testing.assert_allclose([r["distance"] for r in got], [d for d, _ in want], atol=1e-5)
        assert all(set(r) == {"id", "distance", "topic", "_distance"} for r in got)
        assert all(r["topic"] == "space" for r in got)


def test_parquet_and_csv_queries_and_what_a_mode_needs(table, tmp_path):
    vector = json.loads(open(search_supertable.DEFAULT_QUERIES).readlines()[1])["vector"]
    pq.write_table(pa.table({"id": ["p1", "p2"], "text": ["rocket", None],
                             "vector": [vector, vector]}), tmp_path / "q.parquet")
    out = str(tmp_path / "p.jsonl")
    counts = search_supertable.run(["--table", table, "--queries", str(tmp_path / "q.parquet"),
                                    "--output", out, "--mode", "hybrid"])
    assert counts["queries"] == 1 and counts["unparseable"] == 1
    assert results(out)["p1"]["mode"] == "hybrid"
    (bad,) = [json.loads(line) for line in open(out + ".invalid.jsonl")]
    assert bad["reason"] == "query 'p2': hybrid search needs text"

    csv_path = tmp_path / "q.csv"
    csv_path.write_text("id,text,vector\nc1,,\"%s\"\nc2,galaxies,\nc3,,\"[1, 2]\"\nc4,,\n"
                        % json.dumps(vector))
    out = str(tmp_path / "c.jsonl")
    search_supertable.run(["--table", table, "--queries", str(csv_path), "--output", out])
    got = results(out)
    assert got["c1"]["mode"] == "vector" and got["c1"]["results"][0]["id"] == "oceans-18"
    assert got["c2"]["mode"] == "text"
    assert got["c2"]["results"][0]["content"] == "A telescope in orbit sees distant galaxies"
    reasons = sorted(json.loads(line)["reason"] for line in open(out + ".invalid.jsonl"))
    assert reasons == ["query 'c3': expected 32 numbers, got 2",
                       "query 'c4': a query needs text, a vector or both"]


def test_parse_filter():
    expr = parse_filter("topic == \"space\" and year >= 2008 AND score < -1.5e2 and ok != true")
    assert expr.equals((pc.field("topic") == "space") & (pc.field("year") >= 2008)
                       & (pc.field("score") < -150.0) & (pc.field("ok") != True))  # noqa: E712
    assert parse_filter("name == 'its'").equals(pc.field("name") == "its")
    for bad, where in (("year >> 3", "year >> 3"), ("year == 3 or x == 1", "or x == 1"),
                       ("year ==", "year ==")):
        with pytest.raises(ValueError, match=re.escape(repr(where))):
            parse_filter(bad)


def test_settings_are_checked_against_the_table(table, tmp_path):
    out = str(tmp_path / "o.jsonl")
    with pytest.raises(Exception, match="--columns: the table has no column 'nope'"):
        search_supertable.run(["--table", table, "--output", out, "--columns", "nope"])
    with pytest.raises(SystemExit) as bad_flag:    # a malformed flag value: exit 2
        search_supertable.run(["--table", table, "--output", out, "--k", "0"])
    assert bad_flag.value.code == 2
    with pytest.raises(ValueError, match="--table .*none: no supertable there"):
        search_supertable.run(["--table", str(tmp_path / "none"), "--output", out])


def test_help_lists_the_job_options():
    done = subprocess.run([sys.executable, "-m", "pipelines.search_supertable", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for flag in ("--queries", "--format", "--table", "--output", "--k", "--mode", "--filter",
                 "--columns", "--nprobe", "--batch-size"):
        assert flag in done.stdout


@pytest.fixture(scope="module")
def flink_jar():
    return flink.job_server_jar()


@pytest.mark.flink
def test_search_on_flink_equals_direct_runner(flink_jar, table, tmp_path):
    got = {}
    for runner, extra in (("direct", []),
                          ("flink", ["--runner=FlinkRunner", "--flink_master=[local]",
                                     "--parallelism=2", f"--flink_job_server_jar={flink_jar}"])):
        out = str(tmp_path / runner / "results.jsonl")
        counts = search_supertable.run(["--table", table, "--output", out] + extra)
        assert counts["queries"] == 4 and counts["unparseable"] == 1, runner
        got[runner] = job_outputs(out)
    assert got["flink"] == got["direct"]


