"""Review of session 19: the sample's global combine without defaults.

``build_superfiles`` samples with ``CombineGlobally(...).without_defaults()``.
With defaults, Beam refused a bounded input in non-global windows at
construction; without them it would sample, plan, build and commit once per
window, each window planning (and training a grid) on its own rows.
"""

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window

from beam_supertable import Supertable, WriteToSupertable

D = 8
SCHEMA = pa.schema([("n", pa.int64()), ("body", pa.string()), ("emb", pa.list_(pa.float32(), D))])


def _rows(n, start=0):
    x = np.random.default_rng(start).normal(size=(n, D)).astype(np.float32)
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
                   | WriteToSupertable(uri, schema=SCHEMA, vector_column="emb", job_id="w"))
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
                       | WriteToSupertable(uri, schema=SCHEMA, vector_column="emb",
                                           job_id="load-1"))
            assert_that(commits | beam.Map(lambda c: (c.version, c.rows, c.deduplicated)),
                        equal_to(expect))
    assert Supertable.open(uri).version == 1


def test_rows_all_with_null_vectors_are_dead_letters_and_nothing_is_committed(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb")
    rows = [dict(r, emb=None) for r in _rows(30)]
    with TestPipeline() as p:
        result = (p | beam.Create(rows, reshuffle=False)
                  | WriteToSupertable(uri).with_invalid_output())
        assert_that(result.commits, equal_to([]), label="commits")
        assert_that(result.invalid | beam.Map(lambda i: i[0]["n"]), equal_to(list(range(30))),
                    label="invalid")
    t = Supertable.open(uri)
    assert t.version == 0 and t.count_rows() == 0


def test_an_empty_input_into_a_table_with_a_grid_commits_nothing(tmp_path):
    # A table with a vector column and a grid, and a run with no rows at
    # all: no plan, nothing built, the table untouched.
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb")
    with TestPipeline() as p:
        _ = p | beam.Create(_rows(100), reshuffle=False) | WriteToSupertable(uri)
    grid = Supertable.open(uri).properties["grid"]
    with TestPipeline() as p:
        commits = (p | beam.Create([], reshuffle=False).with_output_types(dict)
                   | WriteToSupertable(uri))
        assert_that(commits, equal_to([]))
    t = Supertable.open(uri)
    assert t.version == 1 and t.count_rows() == 100 and t.properties["grid"] == grid
