"""Pipeline helpers shared by the upsert tests."""

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from beam_upsert import Upsert
from beam_upsert.metrics import NAMESPACE

FLAVORS = ("stateful", "grouped")


def timestamped(commands):
    """(key, value, offset, time_seconds) -> timestamped UpsertCommand tuples."""
    return [((k, v, o), t) for k, v, o, t in commands]


class _Stamp(beam.DoFn):
    def process(self, element):
        (cmd, t) = element
        yield TimestampedValue(cmd, t)


class _WithTime(beam.DoFn):
    def process(self, change, ts=beam.DoFn.TimestampParam):
        yield (change.key, change.value, change.diff, ts.micros // 1_000_000)


def run_upsert(commands, prior=None, flavor="grouped", resume_at=None,
               expected=None, expected_invalid=None):
    """Runs Upsert on bounded input and asserts its output; returns counters.

    ``expected_invalid`` is a list of ``(element, reason)`` or a matcher.
    """
    p = TestPipeline()
    cmds = (p | "Cmds" >> beam.Create(timestamped(commands), reshuffle=False)
            | "Stamp" >> beam.ParDo(_Stamp()))
    prior_pc = p | "Prior" >> beam.Create(list(prior)) if prior is not None else None
    result = cmds | Upsert(flavor, prior=prior_pc, resume_at=resume_at).with_invalid_output()
    out = result.changes | beam.ParDo(_WithTime())
    if expected is not None:
        assert_that(out, equal_to(expected), label="changes")
    if expected_invalid is not None:
        if not callable(expected_invalid):
            expected_invalid = equal_to(expected_invalid)
        assert_that(result.invalid | beam.Map(lambda i: (i.element, i.reason)),
                    expected_invalid, label="invalid")
    res = p.run()
    res.wait_until_finish()
    return counters(res)


def counters(result):
    got = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        got[c.key.metric.name] = got.get(c.key.metric.name, 0) + (value or 0)
    return got
