"""A real process mirroring a keyed table into another through its change feed.

    python -m tests.beam_supertable.mirror_proc SOURCE MIRROR CONSUMER START_VERSION

Runs ``ReadChangesFromSupertable(SOURCE, consumer=CONSUMER, start_version=START_VERSION)``
with no end on the DirectRunner, turns each change into an upsert command at its
time and applies them with ``UpsertToSupertable(MIRROR)``; it runs until killed.
A restart resumes where the consumer's record says.
"""

import sys
import time

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from beam_supertable import ReadChangesFromSupertable, UpsertToSupertable
from beam_upsert import UpsertCommand

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])


class ChangeToCommand(beam.DoFn):
    """A change -> an upsert command at its time. Changes arrive in version order
    and two versions may share a time, so the offset is the order of arrival
    (the system's monotonic clock: it keeps counting across a restart)."""

    def process(self, change, at=beam.DoFn.TimestampParam):
        row = change.value if change.diff > 0 else None
        yield TimestampedValue(UpsertCommand(change.key, row, time.monotonic_ns()), at)


def main(argv):
    source, mirror, consumer, start = argv[0], argv[1], argv[2], int(argv[3])
    with beam.Pipeline(options=PipelineOptions(["--streaming"])) as p:
        _ = (p | ReadChangesFromSupertable(source, start_version=start, consumer=consumer,
                                           poll_interval=0.1)
             | beam.ParDo(ChangeToCommand())
             | UpsertToSupertable(mirror, schema=SCHEMA, primary_key="id", flavor="stateful"))


if __name__ == "__main__":
    main(sys.argv[1:])
