"""Random workloads: every flavor and the columnar path equal the reference."""

import apache_beam as beam
import pyarrow as pa
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_upsert import Upsert, UpsertBatches, batches_to_changes, upsert_table
from tests.beam_upsert.helpers import _Stamp, _WithTime, timestamped
from tests.beam_upsert.reference import reference_upsert

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
VALUES = st.one_of(st.none(), st.integers(0, 3))


@st.composite
def workloads(draw):
    n = draw(st.integers(0, 25))
    keys = draw(st.lists(KEYS, min_size=n, max_size=n))
    values = draw(st.lists(VALUES, min_size=n, max_size=n))
    times = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    offsets = draw(st.permutations(range(n)))  # a real source never repeats one
    commands = list(zip(keys, values, offsets, times))
    prior = draw(st.dictionaries(KEYS, st.integers(0, 3), max_size=4))
    resume_at = draw(st.one_of(st.none(), st.integers(0, 5)))
    return commands, sorted(prior.items()), resume_at


def _columnar_input(commands):
    return pa.table({
        "key": pa.array([c[0] for c in commands], pa.string()),
        "value": pa.array([c[1] for c in commands], pa.int64()),
        "offset": pa.array([c[2] for c in commands], pa.int64()),
        "time": pa.array([c[3] * 1_000_000 for c in commands], pa.int64()),
    })


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_path_equals_the_reference(workload):
    commands, prior, resume_at = workload
    expected = reference_upsert(commands, prior, resume_at)
    resume = None if resume_at is None else Timestamp(resume_at)

    # The plain kernel first: quick to shrink when it is the one that is wrong.
    kernel = upsert_table(_columnar_input(commands),
                          pa.table({"key": pa.array([k for k, _ in prior], pa.string()),
                                    "value": pa.array([v for _, v in prior], pa.int64())}),
                          resume_at=resume)
    got = sorted(((r["key"], r["value"], r["diff"], r["time"] // 1_000_000)
                  for r in kernel.to_pylist()), key=repr)
    assert got == expected

    p = TestPipeline()
    cmds = (p | "Cmds" >> beam.Create(timestamped(commands), reshuffle=False)
            | "Stamp" >> beam.ParDo(_Stamp()))
    prior_pc = p | "Prior" >> beam.Create(prior)
    for flavor in ("stateful", "grouped"):
        out = cmds | flavor >> Upsert(flavor, prior=prior_pc, resume_at=resume)
        assert_that(out | f"T{flavor}" >> beam.ParDo(_WithTime()), equal_to(expected),
                    label=f"check_{flavor}")
    batches = p | "Batches" >> beam.Create([_columnar_input(commands[:10]),
                                            _columnar_input(commands[10:])])
    prior_batches = p | "PriorBatches" >> beam.Create([pa.table({
        "key": pa.array([k for k, _ in prior], pa.string()),
        "value": pa.array([v for _, v in prior], pa.int64())})])
    columnar = (batches | UpsertBatches(prior=prior_batches, resume_at=resume, n_partitions=3)
                | beam.ParDo(batches_to_changes()) | "TCol" >> beam.ParDo(_WithTime()))
    assert_that(columnar, equal_to(expected), label="check_columnar")
    p.run().wait_until_finish()
