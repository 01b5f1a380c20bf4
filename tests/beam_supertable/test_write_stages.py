"""The write's planning stage: the vector sample a first grid is trained on."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from beam_supertable import Supertable
from beam_supertable.transforms.write_stages import _SampleVectors, _TableRef

D = 4
SCHEMA = pa.schema([("n", pa.int64()), ("emb", pa.list_(pa.float32(), D))])


def _batches(rows, per_batch):
    """Rows whose vector repeats their row number, in batches of ``per_batch``."""
    out = []
    for start in range(0, rows, per_batch):
        n = np.arange(start, min(rows, start + per_batch))
        x = np.repeat(n.astype(np.float32)[:, None], D, axis=1)
        out.append(pa.table({"n": n, "emb": pa.FixedSizeListArray.from_arrays(
            pa.array(x.ravel()), D)}, schema=SCHEMA))
    return out


def _check_sample(tmp_path, batches, limit, check):
    """Runs the sampler over ``batches`` and ``check(rows, bytes, sample)`` on its output."""
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb")

    def check_one(outputs):
        assert len(outputs) == 1
        check(*outputs[0])

    with TestPipeline() as p:
        stats = (p | beam.Create(batches, reshuffle=True)
                 | beam.CombineGlobally(_SampleVectors(_TableRef(uri, None), limit)))
        assert_that(stats, check_one)


def test_the_sample_holds_limit_distinct_input_rows_drawn_from_all_of_the_input(tmp_path):
    rows, limit = 20_000, 500
    batches = _batches(rows, 137)
    total_bytes = sum(b.nbytes for b in batches)

    def check(count, nbytes, sample):
        assert count == rows and nbytes == total_bytes
        assert sample.shape == (limit, D) and sample.dtype == np.float32
        picked = sample[:, 0].astype(np.int64)
        assert (sample == sample[:, :1]).all()                # whole rows, not mixed ones
        assert len(set(picked)) == limit and picked.min() >= 0 and picked.max() < rows
        # Uniform over the input: each quarter holds about a quarter of the sample
        # (125 expected, standard deviation under 10), however it was batched.
        quarters = np.bincount(picked * 4 // rows, minlength=4)
        assert (np.abs(quarters - limit / 4) < 60).all(), quarters

    _check_sample(tmp_path, batches, limit, check)


def test_an_input_smaller_than_the_limit_is_sampled_whole(tmp_path):
    def check(count, _, sample):
        assert count == 300
        assert sorted(sample[:, 0].astype(int).tolist()) == list(range(300))

    _check_sample(tmp_path, _batches(300, 7), 1000, check)
