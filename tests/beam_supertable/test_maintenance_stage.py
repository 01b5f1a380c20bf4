"""Maintenance behind streaming writers: ``auto_compact`` keeps the small-file debt
bounded over a long stream of one-second commits, ``vacuum_every`` vacuums on a
schedule, and the table still holds exactly the last command per key."""

import datetime
import os
import time

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to

from beam_supertable import Supertable, UpsertToSupertable, WriteToSupertable
from beam_supertable.table.optimize import OPERATION
from beam_supertable.testing import assert_table_rows, upsert_stream
from beam_supertable.transforms.maintenance_stage import wait_for_maintenance

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64())])
KEYS = 40
START = 1_700_000_000
STEP = 10   # slots the watermark passes at a time (each still commits on its own)


def _upsert_slots(uri, slots, **maintenance):
    """One command per one-second slot (keys cycle, so later slots update), one
    commit per slot; returns the pipeline result and the rows the table must hold."""
    stream = upsert_stream()
    latest = {}
    for i in range(slots):
        row = {"id": i % KEYS, "n": i}
        latest[row["id"]] = row
        stream.command(row["id"], row, offset=i, at=START + i)
        if (i + 1) % STEP == 0 or i + 1 == slots:
            stream.advance_watermark(to=START + i + 1)
    p = TestPipeline(options=PipelineOptions(streaming=True))
    commits = (p | stream.build()
               | UpsertToSupertable(uri, **maintenance))
    assert_that(commits | beam.Map(lambda c: c.deduplicated), equal_to([False] * slots))
    result = p.run()
    result.wait_until_finish()
    wait_for_maintenance(uri)
    return result, list(latest.values())


def _optimizes(uri):
    return sum(1 for h in Supertable.open(uri).history() if h["operation"] == OPERATION)


def _superfiles_per_version(uri):
    t = Supertable.open(uri)
    return [t.checkout(v).snapshot.totals["superfiles"] for v in range(1, t.version + 1)
            if _exists(t, v)]


def _exists(t, v):
    try:
        t.checkout(v)
        return True
    except Exception:   # noqa: BLE001 - vacuumed
        return False


@pytest.mark.parametrize("slots,threshold", [
    pytest.param(120, 6, id="120-slots"),
    pytest.param(1000, 16, id="1000-slots", marks=pytest.mark.slow),   # about 2 min
])
def test_auto_compaction_keeps_the_superfile_count_bounded(tmp_path, slots, threshold):
    """Without compaction one superfile per slot piles up; with it every version
    holds at most twice the threshold plus the commit in flight and the output
    of the last compaction."""
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, primary_key="id", iceberg=False)
    result, rows = _upsert_slots(uri, slots, auto_compact=threshold)
    counts = _superfiles_per_version(uri)
    bound = 2 * threshold + 2
    assert max(counts) <= bound, (max(counts), bound)
    assert _optimizes(uri) >= slots // (2 * threshold)
    assert_table_rows(uri, rows, key="id")


def test_scheduled_vacuum_runs_behind_the_commits(tmp_path):
    """Versions an hour old (aged on disk) go, except version 10, the one the run
    started on and reads its priors at; the grace keeps everything the pipeline
    writes, commits in flight included."""
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="id", iceberg=False)
    for i in range(10):
        t.upsert(pa.table({"id": [1000 + i], "n": [i]}, schema=SCHEMA))
    old = time.time() - 3600
    for root, _, files in os.walk(uri):
        for name in files:
            os.utime(os.path.join(root, name), (old, old))
    result, rows = _upsert_slots(uri, 40, vacuum_every=datetime.timedelta(seconds=0.2),
                                 vacuum_retain_versions=3, vacuum_older_than=600)
    assert Supertable.open(uri).history()[0]["version"] == 10
    assert_table_rows(uri, rows + [{"id": 1000 + i, "n": i} for i in range(10)], key="id")


def test_write_to_supertable_compacts_behind_its_firings(tmp_path):
    uri = str(tmp_path / "t")
    stream = TestStream()
    for i in range(40):
        stream = stream.add_elements([{"id": i, "n": i}]).advance_processing_time(2)
    p = TestPipeline(options=PipelineOptions(streaming=True))
    _ = (p | stream.advance_watermark_to_infinity()
         | WriteToSupertable(uri, schema=SCHEMA, commit_every=1, auto_compact=4))
    p.run().wait_until_finish()
    wait_for_maintenance(uri)
    t = Supertable.open(uri)
    assert t.count_rows() == 40
    assert max(_superfiles_per_version(uri)) <= 2 * 4 + 2


@pytest.mark.parametrize("kwargs,message", [
    ({"auto_compact": 1}, "auto_compact must be"),
    ({"auto_compact": "yes"}, "auto_compact must be"),
    ({"vacuum_every": 0}, "vacuum_every must be"),
    ({"vacuum_every": float("inf")}, "vacuum_every must be a finite"),
    ({"vacuum_every": 60, "vacuum_retain_versions": 0}, "vacuum_retain_versions must be"),
    ({"vacuum_every": 60, "vacuum_older_than": -1}, "vacuum_older_than must be"),
])
def test_bad_maintenance_options_are_refused_naming_them(tmp_path, kwargs, message):
    uri = str(tmp_path / "t")
    with pytest.raises(ValueError, match=message):
        UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", **kwargs)
    with pytest.raises(ValueError, match=message):
        WriteToSupertable(uri, schema=SCHEMA, **kwargs)
