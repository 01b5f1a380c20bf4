"""WriteToSupertable / ReadFromSupertable on real Beam pipelines."""

import os
import re
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from beam_supertable import (
    ReadFromSupertable, SchemaMismatchError, Supertable, TokenReuseError, WriteToSupertable)
from beam_supertable.testing import FailFirstAttempt

D = 16
SCHEMA = pa.schema([("n", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D))])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _vectors(n, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(20, D)) * 4
    return (centers[rng.integers(0, 20, n)] + rng.normal(size=(n, D))).astype(np.float32)


def _elements(n, start=0, dict_rows=2000):
    """``n`` rows as dicts (the first ``dict_rows``) and RecordBatches of 5,000."""
    x = _vectors(n, seed=start)
    body = [f"row {start + i} {'even' if (start + i) % 2 == 0 else 'odd'}" for i in range(n)]
    out = [{"n": start + i, "body": body[i], "emb": x[i].tolist()} for i in range(min(n, dict_rows))]
    for s in range(dict_rows, n, 5000):
        e = min(n, s + 5000)
        out.append(pa.record_batch({
            "n": pa.array(np.arange(start + s, start + e)), "body": body[s:e],
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(x[s:e].ravel()), D)}))
    return out


def _write(uri, elements, options=None, **kw):
    p = beam.Pipeline(options=options or PipelineOptions())
    result = p | beam.Create(elements, reshuffle=False) | WriteToSupertable(
        uri, schema=SCHEMA, vector_column="emb", fts_columns=["body"], **kw)
    p.run().wait_until_finish()
    return result


@pytest.mark.slow    # the scale check: 20-30 s a backend
def test_round_trip_50000_rows(table_location):
    _round_trip(table_location, 50_000)


def test_round_trip_5000_rows(table_location):
    _round_trip(table_location, 5_000)


def _round_trip(table_location, n):
    uri, options = table_location
    p = TestPipeline()
    commits = p | beam.Create(_elements(n), reshuffle=False) | WriteToSupertable(
        uri, schema=SCHEMA, vector_column="emb", fts_columns=["body"], storage_options=options)
    assert_that(commits | beam.Map(lambda c: (c.version, c.rows, c.superfiles >= 1)),
                equal_to([(1, n, True)]), label="one_commit")
    p.run().wait_until_finish()
    t = Supertable.open(uri, storage_options=options)
    assert t.count_rows() == n and t.version == 1
    rows = t.to_arrow(columns=["_id", "n", "body"])
    assert sorted(rows["n"].to_pylist()) == list(range(n))
    assert len(set(rows["_id"].to_pylist())) == n
    x = _vectors(n)
    assert t.search(vector=x[123], k=1)["n"].to_pylist() == [123]
    assert t.search(text="row 77", k=1)["n"].to_pylist() == [77]
    expected = [(r["_id"], r["n"], r["body"]) for r in rows.to_pylist()]
    p = TestPipeline()
    read = p | ReadFromSupertable(uri, columns=["_id", "n", "body"], storage_options=options)
    assert_that(read | beam.Map(lambda r: (r["_id"], r["n"], r["body"])), equal_to(expected))
    p.run().wait_until_finish()


def test_read_as_batches_with_filter_pushdown(tmp_path):
    uri = str(tmp_path / "t")
    _write(uri, _elements(3000), n_shards=3)
    t = Supertable.open(uri)
    cut = pc.field("n") >= 2000
    want = sorted(t.to_arrow(filter=cut)["n"].to_pylist())
    p = TestPipeline()
    batches = p | ReadFromSupertable(uri, columns=["n"], filter=cut, as_batches=True)

    def check(got):
        if not all(isinstance(b, pa.RecordBatch) for b in got):
            raise BeamAssertException("expected RecordBatches")
        ns = sorted(v for b in got for v in b.column(0).to_pylist())
        if ns != want:
            raise BeamAssertException(f"got {len(ns)} rows, want {len(want)}")

    assert_that(batches, check)
    p.run().wait_until_finish()


def test_multi_process_direct_runner_gives_the_same_table(tmp_path):
    uri = str(tmp_path / "t")
    options = PipelineOptions(direct_num_workers=2, direct_running_mode="multi_processing")
    _write(uri, _elements(8000), options=options)
    t = Supertable.open(uri)
    assert sorted(t.to_arrow(columns=["n"])["n"].to_pylist()) == list(range(8000))


def test_exactly_once_when_build_and_commit_fail_once(tmp_path):
    uri = str(tmp_path / "t")
    markers = tmp_path / "markers"
    markers.mkdir()
    hook = FailFirstAttempt(markers, ("build", "commit"))
    job = "load-2026-12-02"
    attempts = 0
    while True:  # the orchestrator reruns the same job until it succeeds
        attempts += 1
        try:
            _write(uri, _elements(4000), job_id=job, n_shards=2, on_stage=hook)
            break
        except Exception as exc:  # noqa: BLE001 - the injected failures
            assert "injected failure" in str(exc)
            assert attempts < 6
    assert attempts >= 3  # build failed once, commit failed once after landing
    t = Supertable.open(uri)
    assert sorted(t.to_arrow(columns=["n"])["n"].to_pylist()) == list(range(4000))
    writes = [h for h in t.history() if h["operation"] == "write"]
    assert len(writes) == 1
    report = t.vacuum(older_than=0)  # the failed attempt's superfiles are orphans
    assert any(p.startswith("data/") for p in report.removed_objects)
    assert sorted(Supertable.open(uri).to_arrow(columns=["n"])["n"].to_pylist()) == list(range(4000))


@pytest.mark.slow    # two real processes, each a Beam job: about 20 s
def test_two_pipelines_writing_at_once_both_land(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"])
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.beam_supertable.pipeline_proc", uri, str(start), "3000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for start in (0, 3000)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    t = Supertable.open(uri)
    assert sorted(t.to_arrow(columns=["n"])["n"].to_pylist()) == list(range(6000))
    assert len({e["grid"] for e in t.superfiles()}) == 1  # one grid, whoever stamped it


def test_streaming_commits_once_per_firing(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"])
    stream = TestStream()
    for i in range(3):
        stream = stream.add_elements([r for r in _elements(300, start=i * 300, dict_rows=300)])
        stream = stream.advance_processing_time(30).advance_watermark_to(i + 1)
    stream = stream.advance_watermark_to_infinity()
    p = TestPipeline(options=PipelineOptions(streaming=True))
    commits = p | stream | WriteToSupertable(uri, commit_every=10)
    assert_that(commits | beam.Map(lambda c: c.rows), equal_to([300, 300, 300]))
    p.run().wait_until_finish()
    t = Supertable.open(uri)
    assert sorted(t.to_arrow(columns=["n"])["n"].to_pylist()) == list(range(900))
    assert t.version == 3  # one commit per firing
    assert [h["version"] for h in t.history()] == list(range(t.version + 1))


def test_bad_input(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"])
    other = pa.schema([("n", pa.string())])
    # Settings an existing table ignores must agree with it (they were silently dropped).
    with pytest.raises(SchemaMismatchError, match="metric='cosine'"):
        WriteToSupertable(uri, metric="cosine")
    with pytest.raises(SchemaMismatchError, match="fts_columns"):
        WriteToSupertable(uri, fts_columns=["n"])
    with pytest.raises(ValueError, match="metric"):
        WriteToSupertable(uri, metric="euclid")
    with pytest.raises(TypeError):
        WriteToSupertable(uri, SCHEMA)  # options are keyword-only
    with pytest.raises(SchemaMismatchError, match="does not match"):
        WriteToSupertable(uri, schema=other)
    with pytest.raises(ValueError, match="no schema"):
        WriteToSupertable(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="on_invalid"):
        WriteToSupertable(uri, on_invalid="ignore")
    good = _elements(100, dict_rows=100)
    bad = [{"n": "seven", "body": "x", "emb": [0.0] * D},
           {"n": 1, "body": "x", "emb": [0.0] * (D - 1)},
           {"n": 2, "body": "x", "emb": [float("nan")] * D},
           "not a row"]
    p = TestPipeline()
    result = p | beam.Create(good + bad, reshuffle=False) | WriteToSupertable(uri).with_invalid_output()

    def reasons(got):
        text = sorted(r for _, r in got)
        if len(text) != 4 or not any("'n'" in r for r in text) or not any("NaN" in r for r in text):
            raise BeamAssertException(f"unexpected invalid output: {text}")

    assert_that(result.invalid, reasons)
    p.run().wait_until_finish()
    assert Supertable.open(uri).count_rows() == 100
    with pytest.raises(Exception, match="invalid row"):
        _write(uri, bad[:1], on_invalid="fail")


PLAIN = pa.schema([("n", pa.int64()), ("body", pa.string())])


def _plain_rows(n, start=0, tag="b"):
    return [{"n": i, "body": f"{tag}{i}"} for i in range(start, start + n)]


def _load(uri, rows, expected, **kw):
    """Runs one bounded write; asserts its (version, rows, deduplicated); returns the counters."""
    p = TestPipeline()
    commits = p | beam.Create(rows, reshuffle=False) | WriteToSupertable(uri, schema=PLAIN, **kw)
    if expected is not None:
        assert_that(commits | beam.Map(lambda c: (c.version, c.rows, c.deduplicated)),
                    equal_to(expected))
    result = p.run()
    result.wait_until_finish()
    return {m.key.metric.name: m.committed for m in result.metrics().query(
        MetricsFilter().with_namespace("beam_supertable"))["counters"]}


def test_a_rerun_with_the_same_rows_is_deduplicated(tmp_path, caplog):
    uri = str(tmp_path / "t")
    rows = _plain_rows(500)
    first = _load(uri, rows, [(1, 500, False)], job_id="load-7")
    assert first["commits"] == 1 and first["rows_committed"] == 500
    # The rerun splits and orders the rows differently: still the same commit.
    with caplog.at_level("WARNING", logger="beam_supertable.format.manifest"):
        again = _load(uri, rows[::-1], [(1, 500, True)], job_id="load-7", n_shards=2)
    assert again["deduplicated_commits"] == 1 and again.get("commits", 0) == 0
    assert "token load-7/" in caplog.text and "already landed at version 1" in caplog.text
    t = Supertable.open(uri)
    assert t.version == 1 and t.count_rows() == 500


def test_a_rerun_with_other_rows_fails_with_token_reuse(tmp_path):
    uri = str(tmp_path / "t")
    _load(uri, _plain_rows(500), None, job_id="load-7")
    with pytest.raises(TokenReuseError, match=r"token 'load-7/\S+' already landed at version 1"):
        _load(uri, _plain_rows(500, tag="other"), None, job_id="load-7")
    t = Supertable.open(uri)
    assert t.version == 1 and sorted(t.to_arrow()["body"].to_pylist())[:1] == ["b0"]


def test_without_a_job_id_every_run_commits(tmp_path):
    uri = str(tmp_path / "t")
    write = WriteToSupertable(uri, schema=PLAIN)
    p = beam.Pipeline()
    _ = p | beam.Create(_plain_rows(100), reshuffle=False) | write
    p.run().wait_until_finish()
    p.run().wait_until_finish()  # one graph, run twice (the way a template runs)
    other = beam.Pipeline()      # the same transform object in another pipeline
    _ = other | beam.Create(_plain_rows(100), reshuffle=False) | write
    other.run().wait_until_finish()
    t = Supertable.open(uri)
    writes = [h for h in t.history() if h["operation"] == "write"]
    assert [h["version"] for h in writes] == [1, 2, 3]
    assert len({h["token"] for h in writes}) == 3 and t.count_rows() == 300


def test_a_misspelled_key_goes_to_invalid_naming_it(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, PLAIN)
    rows = _plain_rows(50) + [{"n": 50, "bdy": "typo"}]
    batch = pa.record_batch({"n": [60, 61], "body": ["x", "y"], "extra": [1, 2]})
    p = TestPipeline()
    result = p | beam.Create(rows + [batch], reshuffle=False) | WriteToSupertable(
        uri).with_invalid_output()
    # No id column: a row is named by its position in its RecordBatch, or in
    # the batch of elements a worker conformed (which depends on the batching).
    unknown = "column(s) {} are not in the table schema ['n', 'body']"
    assert_that(result.invalid | beam.Map(
        lambda r: (r[0]["n"], re.sub(r"^row \d+: ", "row ?: ", r[1]))),
        equal_to([(50, "row ?: " + unknown.format(['bdy'])),
                  (60, "row 0 of a RecordBatch: " + unknown.format(['extra'])),
                  (61, "row 1 of a RecordBatch: " + unknown.format(['extra']))]))
    p.run().wait_until_finish()
    assert Supertable.open(uri).count_rows() == 50
    with pytest.raises(SchemaMismatchError, match="'bdy'"):
        p = TestPipeline()
        _ = p | beam.Create(rows, reshuffle=False) | WriteToSupertable(uri, on_invalid="fail")
        p.run().wait_until_finish()
    assert Supertable.open(uri).count_rows() == 50


def test_a_restarted_streaming_job_with_the_same_job_id_commits_its_panes(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, PLAIN)
    for run in range(2):  # pane indices start at 0 again in the second run
        stream = (TestStream().add_elements(_plain_rows(40, start=run * 40))
                  .advance_processing_time(30).advance_watermark_to_infinity())
        p = TestPipeline(options=PipelineOptions(streaming=True))
        commits = p | stream | WriteToSupertable(uri, commit_every=10, job_id="stream")
        assert_that(commits | beam.Map(lambda c: c.rows), equal_to([40]))
        p.run().wait_until_finish()
    t = Supertable.open(uri)
    assert sorted(t.to_arrow()["n"].to_pylist()) == list(range(80))
    assert [h["metadata"]["job"] for h in t.history()[1:]] == ["stream", "stream"]


@pytest.mark.slow
def test_a_rerun_of_a_bounded_job_after_129_tokened_commits_is_deduplicated(tmp_path):
    """README: "a rerun of the same job (same job_id) never commits twice". The rerun's
    ``base_version`` is the table version at the rerun's plan, after the token landed,
    so once 129 tokened commits (a streaming writer's firings, say) pushed the token out
    of ``recent_tokens`` the rerun commits the same rows a second time."""
    import apache_beam as beam

    from beam_supertable import WriteToSupertable

    uri = str(tmp_path / "t")
    schema = pa.schema([("n", pa.int64()), ("body", pa.string())])
    rows = [{"n": i, "body": f"b{i}"} for i in range(20)]

    def load():
        p = beam.Pipeline()
        _ = p | beam.Create(rows, reshuffle=False) | WriteToSupertable(
            uri, schema=schema, job_id="load-1")
        p.run().wait_until_finish()

    load()
    other = Supertable.open(uri)
    for i in range(129):
        other.append(pa.table({"n": [1000 + i], "body": ["s"]}), token=f"stream/{i}")
    load()
    assert Supertable.open(uri).count_rows(pc.field("n") < 1000) == 20
