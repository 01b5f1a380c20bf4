"""A real process mirroring a keyed table into another through its change feed.

    python -m tests.beam_supertable.mirror_proc SOURCE MIRROR CONSUMER START_VERSION

Runs ``ReadChangesFromSupertable(SOURCE, consumer=CONSUMER, start_version=START_VERSION)``
with no end on the DirectRunner, turns each change into an upsert command at its
time and applies them with ``UpsertToSupertable(MIRROR)``; it runs until killed.
A restart resumes where the consumer's record says.
"""

import sys

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from beam_supertable import ReadChangesFromSupertable, UpsertToSupertable
from beam_upsert import UpsertCommand

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])


class ChangeToCommand(beam.DoFn):
    """A change -> an upsert command at its time: an insertion wins over a
    retraction of its key at the same version (greater offset)."""

    def process(self, change, at=beam.DoFn.TimestampParam):
        if change.diff > 0:
            yield TimestampedValue(UpsertCommand(change.key, change.value, 1), at)
        else:
            yield TimestampedValue(UpsertCommand(change.key, None, 0), at)


def main(argv):
    source, mirror, consumer, start = argv[0], argv[1], argv[2], int(argv[3])
    with beam.Pipeline(options=PipelineOptions(["--streaming"])) as p:
        _ = (p | ReadChangesFromSupertable(source, start_version=start, consumer=consumer,
                                           poll_interval=0.1)
             | beam.ParDo(ChangeToCommand())
             | UpsertToSupertable(mirror, schema=SCHEMA, primary_key="id", flavor="stateful"))


if __name__ == "__main__":
    main(sys.argv[1:])
