"""Random workloads: every flavor and the columnar path equal the reference.

Offsets are drawn from small ranges so that equal offsets at one (key, time)
are common, and from several classes (ints, strings, tuples of mixed part
types) so that offsets that do not order against each other are common too;
snapshots may repeat a key. Changes and refused elements are both checked.
"""

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_upsert import Upsert, UpsertBatches, batches_to_changes, upsert_table
from tests.beam_upsert.helpers import _Stamp, _WithTime, timestamped
from tests.beam_upsert.reference import reference

KEYS = st.sampled_from(["a", "b", "c", "d"])
VALUES = st.one_of(st.none(), st.integers(0, 3))
OFFSETS = {
    "int": st.integers(0, 6),
    "str": st.sampled_from(["1", "4", "6"]),
    "tuple": st.one_of(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                       st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"]))),
}


@st.composite
def workloads(draw):
    kinds = draw(st.sampled_from([("int",), ("str",), ("int", "str"), ("int", "str", "tuple")]))
    n = draw(st.integers(0, 25))
    commands = [
        (draw(KEYS), draw(VALUES), draw(st.one_of(*(OFFSETS[k] for k in kinds))),
         draw(st.integers(0, 5)))
        for _ in range(n)]
    prior = draw(st.lists(st.tuples(KEYS, st.integers(0, 3)), max_size=5))
    resume_at = draw(st.one_of(st.none(), st.integers(0, 5)))
    return commands, prior, resume_at


def _refused(invalid):
    """A refused element as the reference writes it, whichever path refused it."""
    element = invalid.element
    if isinstance(element, dict):
        element = tuple(element[c] for c in ("key", "value", "offset") if c in element)
    return tuple(element)


def _table(commands, offset_type):
    return pa.table({
        "key": pa.array([c[0] for c in commands], pa.string()),
        "value": pa.array([c[1] for c in commands], pa.int64()),
        "offset": pa.array([c[2] for c in commands], offset_type),
        "time": pa.array([c[3] * 1_000_000 for c in commands], pa.int64()),
    })


def _batches(commands):
    """Arrow batches, one offset type each (a column holds one type)."""
    out = []
    for kind, offset_type in ((int, pa.int64()), (str, pa.string())):
        rows = [c for c in commands if isinstance(c[2], kind)]
        out += [_table(part, offset_type) for part in (rows[:6], rows[6:]) if part]
    return out


def _prior_table(prior):
    return pa.table({"key": pa.array([k for k, _ in prior], pa.string()),
                     "value": pa.array([v for _, v in prior], pa.int64())})


_PROPERTY = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


# Each example runs a Beam pipeline (about 6 s here): the full run is slow,
# a few examples of the same property keep it in the default run.
@pytest.mark.slow
@settings(max_examples=40, **_PROPERTY)
@given(workloads())
def test_every_path_equals_the_reference(workload):
    _check_every_path(workload)


@settings(max_examples=3, **_PROPERTY)
@given(workloads())
def test_every_path_equals_the_reference_on_a_few_workloads(workload):
    _check_every_path(workload)


def _check_every_path(workload):
    commands, prior, resume_at = workload
    expected, expected_invalid = reference(commands, prior, resume_at)
    columnar_ok = not any(isinstance(c[2], tuple) for c in commands)
    one_class = len({type(c[2]) for c in commands}) <= 1

    # The plain kernel first: quick to shrink when it is the one that is wrong.
    if columnar_ok and one_class:
        offset_type = pa.string() if commands and isinstance(commands[0][2], str) else pa.int64()
        kernel = upsert_table(_table(commands, offset_type), _prior_table(prior),
                              resume_at=None if resume_at is None else resume_at * 1_000_000,
                              with_invalid=True)
        got = sorted(((r["key"], r["value"], r["diff"], r["time"] // 1_000_000)
                      for r in kernel.changes.to_pylist()), key=repr)
        assert got == expected
        assert sorted(map(_refused, kernel.invalid), key=repr) == expected_invalid

    # One assertion per path over changes and refused elements together keeps
    # each example's pipeline small.
    both = [("change", c) for c in expected] + [("invalid", i) for i in expected_invalid]

    def check(path, changes, invalid):
        tagged = (changes | f"T{path}" >> beam.ParDo(_WithTime())
                  | f"TC{path}" >> beam.Map(lambda c: ("change", c)),
                  invalid | f"TI{path}" >> beam.Map(lambda i: ("invalid", _refused(i))))
        assert_that(tagged | f"F{path}" >> beam.Flatten(), equal_to(both), label=path)

    resume = None if resume_at is None else Timestamp(resume_at)
    p = TestPipeline()
    cmds = (p | "Cmds" >> beam.Create(timestamped(commands), reshuffle=False)
            | "Stamp" >> beam.ParDo(_Stamp()))
    prior_pc = p | "Prior" >> beam.Create(prior)
    for flavor in ("stateful", "grouped"):
        result = cmds | flavor >> Upsert(
            flavor, prior=prior_pc, resume_at=resume).with_invalid_output()
        check(flavor, result.changes, result.invalid)
    if columnar_ok:
        batches = p | "Batches" >> beam.Create(_batches(commands))
        prior_batches = p | "PriorBatches" >> beam.Create(
            [_prior_table(prior[:2]), _prior_table(prior[2:])])
        columnar = (batches | UpsertBatches(prior=prior_batches, resume_at=resume,
                                            n_partitions=3).with_invalid_output())
        check("columnar", columnar.changes | beam.ParDo(batches_to_changes()),
              columnar.invalid)
    p.run().wait_until_finish()
