"""The columnar path: kernel details, partitioning and bad batches."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from beam_upsert import UpsertBatches, batches_to_changes, upsert_table
from beam_upsert.columnar import partition_of
from tests.beam_upsert.helpers import counters


def test_kernel_accepts_timestamp_time_and_resume():
    t = pa.table({
        "id": pa.array([1, 1, 2]),
        "v": pa.array(["a", "b", "c"]),
        "o": pa.array([1, 2, 3]),
        "ts": pa.array([0, 2_000_000, 1_000_000], pa.timestamp("us")),
    })
    out = upsert_table(t, key="id", value="v", offset="o", time="ts", resume_at=1_000_000)
    assert out.to_pylist() == [
        {"key": 1, "value": "b", "diff": 1, "time": 2_000_000},
        {"key": 2, "value": "c", "diff": 1, "time": 1_000_000},
    ]


def test_partition_of_is_deterministic_and_balanced():
    keys = pa.array([f"user-{i}" for i in range(20_000)])
    parts = partition_of(keys, 16)
    assert np.array_equal(parts, partition_of(keys, 16))
    counts = np.bincount(parts, minlength=16)
    assert counts.min() > 0.7 * counts.mean(), counts
    ints = partition_of(pa.array(np.arange(20_000)), 16)
    assert np.bincount(ints, minlength=16).min() > 0.7 * 20_000 / 16
    # A sliced array hashes its own rows, not the parent's.
    assert np.array_equal(partition_of(keys.slice(5, 10), 16), parts[5:15])


def test_bad_batches_and_rows_go_to_invalid():
    good = pa.table({"key": ["a", None], "value": [1, 2], "offset": [1, 2], "time": [0, 0]})
    missing = pa.table({"key": ["b"], "value": [1]})
    p = TestPipeline()
    result = (p | beam.Create([good, missing])
              | UpsertBatches().with_invalid_output())
    rows = result.changes | beam.ParDo(batches_to_changes())
    assert_that(rows, equal_to([("a", 1, 1)]), label="changes")

    def check(invalid):
        reasons = sorted(i.reason for i in invalid)
        if len(reasons) != 2 or "lacks column" not in reasons[0] or "null" not in reasons[1]:
            raise BeamAssertException(f"unexpected invalid output {invalid}")

    assert_that(result.invalid, check, label="invalid")
    res = p.run()
    res.wait_until_finish()
    got = counters(res)
    assert got["invalid"] == 2
    assert got["inserts"] == 1
