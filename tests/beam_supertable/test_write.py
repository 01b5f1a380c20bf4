"""WriteToSupertable and the table it writes to: built without writing, created when run,
one commit on one grid per bounded input whatever its windowing, none without rows."""

import os
import re
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window

from beam_supertable import SchemaMismatchError, Supertable, WriteToSupertable
from beam_supertable.format.store import ObjectStore
from beam_supertable.transforms import CommitResult
from tests.beam_supertable.test_transforms import ROOT, SCHEMA, _elements

PLAIN = pa.schema([("n", pa.int64()), ("body", pa.string())])


def _objects(uri, options):
    return [o.path for o in ObjectStore(uri, options).list("")]


def test_building_the_pipeline_writes_nothing_and_running_it_creates_the_table(table_location):
    uri, options = table_location
    write = WriteToSupertable(uri, schema=SCHEMA, vector_column="emb", fts_columns=["body"],
                              storage_options=options)
    p = TestPipeline()
    commits = p | beam.Create(_elements(600, dict_rows=600), reshuffle=False) | write
    assert_that(commits | beam.Map(lambda c: (c.version, c.rows)), equal_to([(1, 600)]))
    p.to_runner_api()   # the graph the runner gets is built too: still nothing written
    assert _objects(uri, options) == []
    if "://" not in uri:
        assert not os.path.exists(uri)
    p.run().wait_until_finish()
    t = Supertable.open(uri, storage_options=options)
    assert t.count_rows() == 600 and t.version == 1
    assert t.properties["vector"]["column"] == "emb" and t.properties["fts"]["columns"] == ["body"]


def test_a_missing_table_without_a_schema_fails_at_construction_naming_it(tmp_path):
    uri = str(tmp_path / "missing")
    with pytest.raises(ValueError, match=f"no table at '{uri}' and no schema"):
        WriteToSupertable(uri)
    assert not os.path.exists(uri)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"vector_column": "nope"}, SchemaMismatchError, "vector_column 'nope' is not in the schema"),
    ({"fts_columns": ["n"]}, SchemaMismatchError, "fts column 'n' must be a string"),
    ({"fts_columns": "body"}, TypeError, "fts_columns must be a list"),
    ({"metric": "euclid"}, ValueError, "metric must be one of"),
    ({"n_cells": 0}, ValueError, "n_cells must be a positive int"),
    ({"replica_factor": 2.0}, ValueError, "replica_factor must be a share"),
    ({"batch_rows": 0}, ValueError, "batch_rows must be a positive int"),
    ({"schema": {"n": "int64"}}, TypeError, "schema must be a pyarrow.Schema"),
])
def test_bad_settings_for_a_missing_table_fail_at_construction_writing_nothing(
        tmp_path, kwargs, error, match):
    uri = str(tmp_path / "missing")
    with pytest.raises(error, match=match):
        WriteToSupertable(uri, **{"schema": PLAIN, **kwargs})
    assert not os.path.exists(uri)


def test_a_table_created_meanwhile_with_other_settings_fails_the_run_naming_it(tmp_path):
    uri = str(tmp_path / "t")
    p = TestPipeline()
    _ = p | beam.Create([{"n": 1, "body": "a"}]) | WriteToSupertable(uri, schema=PLAIN)
    Supertable.create(uri, pa.schema([("n", pa.int64())]))   # someone else, another schema
    with pytest.raises(SchemaMismatchError, match=f"{uri}: a table exists here with other"):
        p.run().wait_until_finish()
    assert Supertable.open(uri).version == 0


def test_a_table_created_meanwhile_with_the_same_settings_is_written(tmp_path):
    uri = str(tmp_path / "t")
    p = TestPipeline()
    commits = p | beam.Create([{"n": 1, "body": "a"}]) | WriteToSupertable(uri, schema=PLAIN)
    assert_that(commits, equal_to([CommitResult(1, 1, 1)]))
    Supertable.create(uri, PLAIN)
    p.run().wait_until_finish()
    assert Supertable.open(uri).to_arrow(columns=["n", "body"]).to_pylist() == [
        {"n": 1, "body": "a"}]


@pytest.mark.slow    # two real processes, each a Beam job: about 20 s
def test_two_processes_create_the_same_missing_table_at_once(tmp_path):
    uri = str(tmp_path / "t")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.beam_supertable.pipeline_proc", uri, str(start), "2000",
         "create"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for start in (0, 2000)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    t = Supertable.open(uri)
    history = t.history()
    assert [h["operation"] for h in history] == ["create", "write", "write"]
    assert sorted(t.to_arrow(columns=["n"])["n"].to_pylist()) == list(range(4000))
    assert len({e["grid"] for e in t.superfiles()}) == 1   # one grid, whoever stamped it


def test_a_keyed_table_is_refused_at_construction_and_when_it_becomes_keyed_later(tmp_path):
    keyed = str(tmp_path / "keyed")
    Supertable.create(keyed, PLAIN, primary_key="n")
    with pytest.raises(SchemaMismatchError, match="keyed.*UpsertToSupertable"):
        WriteToSupertable(keyed)
    # Missing while the pipeline is built, keyed by the time it runs.
    later = str(tmp_path / "later")
    write = WriteToSupertable(later, schema=PLAIN)
    p = TestPipeline()
    _ = p | beam.Create([{"n": 1, "body": "a"}, {"n": 1, "body": "b"}]) | write
    Supertable.create(later, PLAIN, primary_key="n")
    with pytest.raises(Exception, match="keyed"):
        p.run().wait_until_finish()
    assert Supertable.open(later).count_rows() == 0


def _side_inputs_under(p, prefix):
    """Labels of the transforms under ``prefix`` that take a side input, in the runner's graph."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2
    out = []
    for t in p.to_runner_api().components.transforms.values():
        if (t.unique_name.startswith(prefix)
                and t.spec.urn == common_urns.primitives.PAR_DO.urn):
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            if payload.side_inputs:
                out.append(t.unique_name)
    return out


def test_the_plan_follows_the_sample_without_a_side_input(tmp_path):
    # On a portable runner (Flink) a step with a side input starts a stage
    # of its own: the sample's global combine must not inject a default
    # through one (an empty input commits nothing either way).
    p = TestPipeline()
    _ = (p | beam.Create(_elements(10, dict_rows=10), reshuffle=False)
         | "Write" >> WriteToSupertable(str(tmp_path / "t"), schema=SCHEMA, vector_column="emb"))
    assert _side_inputs_under(p, "Write/Stats") == []
    assert _side_inputs_under(p, "Write/Plan") == []


def test_an_empty_input_commits_nothing(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb")
    with TestPipeline() as p:
        commits = (p | beam.Create([], reshuffle=False).with_output_types(dict)
                   | WriteToSupertable(uri))
        assert_that(commits, equal_to([]))
    assert Supertable.open(uri).version == 0


# -- bounded input: one global sample and plan, whatever the windowing ----------------
D8 = 8
SCHEMA8 = pa.schema([("n", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D8))])


def _rows(n, start=0):
    x = np.random.default_rng(start).normal(size=(n, D8)).astype(np.float32)
    return [{"n": start + i, "body": f"row {start + i}", "emb": x[i].tolist()} for i in range(n)]


@pytest.mark.parametrize("windowing", [
    lambda: beam.WindowInto(window.FixedWindows(50)),
    lambda: beam.WindowInto(window.Sessions(1)),
    lambda: beam.WindowInto(window.GlobalWindows(), trigger=trigger.Repeatedly(
        trigger.AfterCount(20)), accumulation_mode=trigger.AccumulationMode.DISCARDING),
], ids=["fixed", "sessions", "global-triggered"])
def test_bounded_windowed_input_lands_as_one_commit_on_one_grid(tmp_path, windowing):
    # The transform's contract: bounded input lands as one commit. Windows
    # or triggers upstream must not split it into commits on separate grids.
    uri = str(tmp_path / "t")
    with TestPipeline() as p:
        commits = (p | beam.Create(_rows(200), reshuffle=False)
                   | beam.Map(lambda r: window.TimestampedValue(r, r["n"]))
                   | windowing()
                   | WriteToSupertable(uri, schema=SCHEMA8, vector_column="emb", job_id="w"))
        assert_that(commits | beam.Map(lambda c: (c.version, c.rows, c.deduplicated)),
                    equal_to([(1, 200, False)]))
    t = Supertable.open(uri)
    assert t.version == 1 and t.count_rows() == 200
    assert {e["grid"] for e in t.superfiles()} == {t.properties["grid"]["sha256"]}
    assert sorted(t.to_arrow(columns=["n"])["n"].to_pylist()) == list(range(200))


def test_a_rerun_of_a_windowed_bounded_write_with_its_job_id_commits_nothing(tmp_path):
    uri = str(tmp_path / "t")
    for expect in ([(1, 200, False)], [(1, 200, True)]):
        with TestPipeline() as p:
            commits = (p | beam.Create(_rows(200), reshuffle=False)
                       | beam.Map(lambda r: window.TimestampedValue(r, r["n"]))
                       | beam.WindowInto(window.FixedWindows(50))
                       | WriteToSupertable(uri, schema=SCHEMA8, vector_column="emb",
                                           job_id="load-1"))
            assert_that(commits | beam.Map(lambda c: (c.version, c.rows, c.deduplicated)),
                        equal_to(expect))
    assert Supertable.open(uri).version == 1


def test_rows_all_with_null_vectors_are_dead_letters_and_nothing_is_committed(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA8, vector_column="emb")
    rows = [dict(r, emb=None) for r in _rows(30)]
    with TestPipeline() as p:
        result = (p | beam.Create(rows, reshuffle=False)
                  | WriteToSupertable(uri).with_invalid_output())
        assert_that(result.commits, equal_to([]), label="commits")
        assert_that(result.invalid | beam.Map(lambda i: i[0]["n"]), equal_to(list(range(30))),
                    label="invalid")
    t = Supertable.open(uri)
    assert t.version == 0 and t.count_rows() == 0


SENSORS = pa.schema([pa.field("sensor_id", pa.string(), nullable=False),
                     pa.field("reading", pa.int64(), nullable=False),
                     ("note", pa.string()), ("emb", pa.list_(pa.float32(), 4))])


def _sensor(i, **changes):
    return dict({"sensor_id": f"s-{i}", "reading": i, "note": None,
                 "emb": [1.0, 0.0, 0.0, float(i)]}, **changes)


def test_each_kind_of_bad_row_is_an_invalid_naming_row_column_and_type(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SENSORS, vector_column="emb")
    big = 2**70
    bad = [_sensor(101, reading="abc"),
           {k: v for k, v in _sensor(102).items() if k != "reading"},
           _sensor(103, colour="red"),
           _sensor(104, emb=[1.0, 2.0]),
           _sensor(105, emb=[1.0, float("nan"), 0.0, 0.0]),
           _sensor(106, emb=[1.0, float("inf"), 0.0, 0.0]),
           _sensor(107, reading=big),
           _sensor(108, note=5),
           _sensor(109, reading=None),
           _sensor(110, emb=None),
           _sensor(111, emb=[1.0, "x", 0.0, 0.0]),
           _sensor(112, emb=[1e300, 0.0, 0.0, 0.0]),
           _sensor(113, emb=[1e20, 0.0, 0.0, 0.0])]
    batch = pa.RecordBatch.from_pylist([_sensor(0), _sensor(1, reading=None), _sensor(2)],
                                       schema=SENSORS.remove(1).insert(
                                           1, pa.field("reading", pa.int64())))
    elements = [_sensor(i) for i in range(10, 30)] + bad + [batch, "not a row"]
    expected = [
        "row with sensor_id 's-101': column 'reading' expects int64, got str 'abc'",
        "row with sensor_id 's-102': column 'reading' expects int64, but the row lacks it "
        "(the column is not nullable)",
        "row with sensor_id 's-103': column(s) ['colour'] are not in the table schema "
        "['sensor_id', 'reading', 'note', 'emb']",
        "row with sensor_id 's-104': column 'emb' expects 4 float32 values, got 2",
        "row with sensor_id 's-105': column 'emb' expects 4 finite float32 values, got NaN at "
        "position 1",
        "row with sensor_id 's-106': column 'emb' expects 4 finite float32 values, got "
        "infinity at position 1",
        f"row with sensor_id 's-107': column 'reading' expects int64, got int {big}, outside "
        "int64's range",
        "row with sensor_id 's-108': column 'note' expects string, got int 5",
        "row with sensor_id 's-109': column 'reading' expects int64, got null (the column is "
        "not nullable)",
        "row with sensor_id 's-110': column 'emb' expects 4 float32 values, got null (every "
        "row needs a vector)",
        "row with sensor_id 's-111': column 'emb' expects 4 float32 values, got str 'x' at "
        "position 1",
        "row with sensor_id 's-112': column 'emb' expects 4 finite float32 values, got 1e+300 "
        "at position 0, beyond float32's range",
        "row with sensor_id 's-113': column 'emb': the vector is too large: its squared norm "
        "overflows float32 distances (keep it under 8.5e+37)",
        "row with sensor_id 's-1': column 'reading' expects int64, got null (the column is "
        "not nullable)",
        "row ?: expected a dict row or a RecordBatch, got str 'not a row'",
    ]
    with TestPipeline() as p:
        result = (p | beam.Create(elements, reshuffle=False)
                  | WriteToSupertable(uri).with_invalid_output())
        assert_that(result.invalid | beam.Map(
            lambda i: (type(i).__name__, re.sub(r"^row \d+: ", "row ?: ", i.reason))),
            equal_to([("Invalid", reason) for reason in expected]), label="invalid")
        assert_that(result.invalid | "Elements" >> beam.Map(
            lambda i: i.element if isinstance(i.element, str) else i.element["sensor_id"]),
            equal_to([f"s-{i}" for i in range(101, 114)] + ["s-1", "not a row"]),
            label="elements")
    t = Supertable.open(uri)
    assert sorted(t.to_arrow(columns=["sensor_id"])["sensor_id"].to_pylist()) == sorted(
        [f"s-{i}" for i in range(10, 30)] + ["s-0", "s-2"])


def test_a_bad_row_fails_the_job_with_its_reason_on_invalid_fail(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SENSORS, vector_column="emb")
    with pytest.raises(Exception, match="column 'emb' expects 4 float32 values, got 3"):
        with TestPipeline() as p:
            _ = (p | beam.Create([_sensor(1), _sensor(2, emb=[1.0, 2.0, 3.0])], reshuffle=False)
                 | WriteToSupertable(uri, on_invalid="fail"))
    assert Supertable.open(uri).version == 0


def test_an_empty_input_into_a_table_with_a_grid_commits_nothing(tmp_path):
    # A table with a vector column and a grid, and a run with no rows at
    # all: no plan, nothing built, the table untouched.
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA8, vector_column="emb")
    with TestPipeline() as p:
        _ = p | beam.Create(_rows(100), reshuffle=False) | WriteToSupertable(uri)
    grid = Supertable.open(uri).properties["grid"]
    with TestPipeline() as p:
        commits = (p | beam.Create([], reshuffle=False).with_output_types(dict)
                   | WriteToSupertable(uri))
        assert_that(commits, equal_to([]))
    t = Supertable.open(uri)
    assert t.version == 1 and t.count_rows() == 100 and t.properties["grid"] == grid
