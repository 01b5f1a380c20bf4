"""The pipelines on a real Flink runtime (Beam's FlinkRunner, parallelism 2).

Each test runs the same pipeline on the DirectRunner and on Flink and asserts
equal outputs (and, for the upsert, equality with the plain reference model).
``flink_master=[local]`` runs an embedded Flink cluster inside the job server
process; the standalone-cluster tests live in ``test_flink_cluster.py``.
"""

import glob
import json
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from beam_supertable import ReadFromSupertable, Supertable, WriteToSupertable
from beam_supertable.jobs import flink, upsert_changes
from beam_upsert import Upsert
from tests.beam_supertable.jobs.outputs import job_outputs
from tests.beam_upsert.helpers import FLAVORS, _Stamp, _WithTime, timestamped
from tests.beam_upsert.reference import reference_upsert

pytestmark = pytest.mark.flink


@pytest.fixture(scope="session")
def flink_jar():
    return flink.job_server_jar()


def on_flink(jar, *extra):
    return flink.flink_options(2, "[local]", f"--flink_job_server_jar={jar}", *extra)


def _read_lines(prefix):
    out = []
    for path in sorted(glob.glob(prefix + "*")):
        with open(path) as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out


def _workload(seed=7, n=3000, keys=250, times=25):
    rng = random.Random(seed)
    commands, offsets = [], list(range(n))
    rng.shuffle(offsets)
    for i in range(n):
        value = None if rng.random() < 0.15 else rng.randrange(6)
        commands.append((f"k{rng.randrange(keys):03d}", value, offsets[i], rng.randrange(times)))
    prior = sorted({f"k{rng.randrange(keys):03d}": rng.randrange(6) for _ in range(120)}.items())
    return commands, prior


def _upsert_pipeline(options, commands, prior, flavor, resume_at, out_prefix, expected):
    p = beam.Pipeline(options=options)
    cmds = (p | "Cmds" >> beam.Create(timestamped(commands)) | "Stamp" >> beam.ParDo(_Stamp()))
    prior_pc = p | "Prior" >> beam.Create(prior)
    result = cmds | Upsert(flavor, prior=prior_pc, resume_at=resume_at).with_invalid_output()
    out = result.changes | beam.ParDo(_WithTime())
    assert_that(out, equal_to(expected), label="changes")
    # Prefixes that no shard pattern of the other matches: a file sink's
    # finalize deletes stale files matching "<prefix>-*-of-N" before renaming.
    _ = (out | beam.Map(json.dumps)
         | beam.io.WriteToText(out_prefix + "-changes"))
    invalid = result.invalid | beam.Map(lambda i: json.dumps([repr(i.element), i.reason]))
    _ = invalid | "WriteInvalid" >> beam.io.WriteToText(out_prefix + "-invalid")
    p.run().wait_until_finish()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_upsert_with_snapshot_equals_direct_runner(flavor, flink_jar, tmp_path):
    commands, prior = _workload()
    # Malformed commands travel to the invalid output on both runners.
    bad = [(None, 1, 10_000, 3), ("kbad", 1, None, 4)]
    resume_at = Timestamp(2)  # a plain int resume_at would be microseconds
    expected = reference_upsert(commands, prior, 2)
    assert len(expected) > 1000  # a workload with real work in it
    got = {}
    for runner, options in (("direct", PipelineOptions()), ("flink", on_flink(flink_jar))):
        prefix = str(tmp_path / runner / "changes")
        _upsert_pipeline(options, commands + bad, prior, flavor, resume_at, prefix, expected)
        got[runner] = (sorted(map(tuple, _read_lines(prefix + "-changes")), key=repr),
                       sorted(map(tuple, _read_lines(prefix + "-invalid"))))
    assert got["flink"][0] == sorted(expected, key=repr)
    assert [list(t) for t in got["flink"][0]] == [list(t) for t in got["direct"][0]]
    assert got["flink"][1] == got["direct"][1] and len(got["flink"][1]) == 2


D = 16
SCHEMA = pa.schema([("n", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D))])


def _rows(n, seed=3):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(12, D)) * 4
    x = (centers[rng.integers(0, 12, n)] + rng.normal(size=(n, D))).astype(np.float32)
    return [{"n": i, "body": f"row {i} {'even' if i % 2 == 0 else 'odd'}", "emb": x[i].tolist()}
            for i in range(n)], x


def _write_and_read(options, uri, rows, out_prefix):
    p = beam.Pipeline(options=options)
    commits = (p | beam.Create(rows)
               | WriteToSupertable(uri, schema=SCHEMA, vector_column="emb", fts_columns=["body"],
                                   n_shards=4))
    _ = (commits | beam.Map(lambda c: json.dumps([c.version, c.rows]))
         | "WriteCommits" >> beam.io.WriteToText(out_prefix + "-commits"))
    p.run().wait_until_finish()
    p = beam.Pipeline(options=options)
    _ = (p | ReadFromSupertable(uri, columns=["_id", "n", "body", "emb"])
         | beam.Map(lambda r: json.dumps([r["_id"], r["n"], r["body"], r["emb"]]))
         | beam.io.WriteToText(out_prefix + "-rows"))
    p.run().wait_until_finish()
    return _read_lines(out_prefix + "-commits"), _read_lines(out_prefix + "-rows")


def test_write_then_read_supertable_equals_direct_runner(flink_jar, tmp_path):
    n = 12_000
    rows, x = _rows(n)
    contents = {}
    for runner, options in (("direct", PipelineOptions()), ("flink", on_flink(flink_jar))):
        uri = str(tmp_path / runner / "table")
        commits, read = _write_and_read(options, uri, rows, str(tmp_path / runner / "out"))
        assert commits == [[1, n]], runner
        t = Supertable.open(uri)
        assert t.version == 1 and t.count_rows() == n
        table = t.to_arrow(columns=["_id", "n"])
        assert len(set(table["_id"].to_pylist())) == n
        # What ReadFromSupertable returned is exactly the table, _ids included.
        assert sorted((r[0], r[1]) for r in read) == sorted(
            zip(table["_id"].to_pylist(), table["n"].to_pylist()))
        assert t.search(vector=x[4321], k=1)["n"].to_pylist() == [4321]
        assert t.search(text="row 77", k=1)["n"].to_pylist() == [77]
        contents[runner] = sorted((r[1], r[2], tuple(r[3])) for r in read)
    assert contents["flink"] == contents["direct"]
    assert [c[0] for c in contents["flink"]] == list(range(n))


def test_main_job_on_flink_equals_direct_runner(flink_jar, tmp_path):
    outputs, summaries = {}, {}
    for runner, extra in (("direct", []),
                          ("flink", ["--runner=FlinkRunner", "--flink_master=[local]",
                                     "--parallelism=2", f"--flink_job_server_jar={flink_jar}"])):
        out = str(tmp_path / runner / "changes.jsonl")
        summaries[runner] = upsert_changes.run(["--output", out] + extra)
        outputs[runner] = job_outputs(out)
    assert outputs["flink"] == outputs["direct"]
    assert len(outputs["flink"][0]) > 100 and len(outputs["flink"][1]) == 2
    for name in ("inserts", "updates", "deletes", "rehydrated"):
        assert summaries["flink"].get(name) == summaries["direct"].get(name), name


def test_plain_flink_runner_options_find_the_staged_job_server(flink_jar):
    # No jar named: Beam looks in its jar cache, where scripts/flink-job-server
    # staged the job server, before trying to download one.
    commands, prior = _workload(seed=3, n=400, keys=40, times=5)
    expected = reference_upsert(commands, prior)
    p = beam.Pipeline(options=PipelineOptions([
        "--runner=FlinkRunner", "--flink_master=[local]", "--parallelism=2",
        "--environment_type=LOOPBACK"]))
    cmds = (p | "Cmds" >> beam.Create(timestamped(commands)) | "Stamp" >> beam.ParDo(_Stamp()))
    changes = cmds | Upsert("grouped", prior=p | "Prior" >> beam.Create(prior))
    assert_that(changes | beam.ParDo(_WithTime()), equal_to(expected))
    p.run().wait_until_finish()


class _AppendChange(beam.DoFn):
    """Appends each change to a file as it arrives (the job runs in loopback)."""

    def __init__(self, path):
        self._path = path

    def process(self, change):
        with open(self._path, "a", encoding="utf-8") as f:
            f.write(json.dumps([change.key, change.value, change.diff]) + "\n")


def _per_key(lines):
    out = {}
    for key, row, diff in lines:
        out.setdefault(key, []).append([row, diff])
    return out


def test_the_change_feed_on_flink_is_the_table_changes_bounded_and_tailing(flink_jar, tmp_path):
    import threading
    import time

    from beam_supertable import ReadChangesFromSupertable
    schema = pa.schema([("id", pa.int64()), ("label", pa.string())])
    t = Supertable.create(str(tmp_path / "t"), schema, primary_key="id", iceberg=False)
    t.upsert(pa.table({"id": list(range(20)), "label": ["a"] * 20}))
    t.upsert(pa.table({"id": [3, 4, 30], "label": ["b", "b", "b"]}))

    # Bounded: planned once, read in parallel.
    p = beam.Pipeline(options=on_flink(flink_jar))
    out = p | ReadChangesFromSupertable(t.uri, start_version=0, end_version="latest")
    assert_that(out | beam.Map(tuple), equal_to(
        [(r["id"], {"id": r["id"], "label": r["label"]}, r["_change"])
         for r in t.changes(0).to_pylist()]))
    p.run().wait_until_finish()

    # Tailing, in streaming mode: a writer commits while the job runs, and
    # waits for the job to emit its first version before committing the rest.
    start, more = t.version, 5
    seen = tmp_path / "tail.jsonl"

    def writer():
        t.upsert(pa.table({"id": [0], "label": ["t0"]}))
        deadline = time.monotonic() + 300
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for i in range(1, more):
            time.sleep(0.3)
            t.upsert(pa.table({"id": [i % 2, 100 + i], "label": [f"t{i}", "new"]}))

    thread = threading.Thread(target=writer)
    thread.start()
    p = beam.Pipeline(options=on_flink(flink_jar, "--streaming"))
    _ = (p | ReadChangesFromSupertable(t.uri, start_version=start, end_version=start + more,
                                       poll_interval=0.1)
         | beam.ParDo(_AppendChange(str(seen))))
    p.run().wait_until_finish()
    thread.join()
    lines = [json.loads(line) for line in seen.read_text().splitlines()]
    want = [[r["id"], {"id": r["id"], "label": r["label"]}, r["_change"]]
            for r in Supertable.open(t.uri).changes(start).to_pylist()]
    assert _per_key(lines) == _per_key(want) and len(lines) == len(want) == 4 * 3 + 2
