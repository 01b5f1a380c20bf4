"""A whole Beam pipeline in its own process, for the concurrent-writers test.

    python -m tests.beam_supertable.pipeline_proc URI START N
"""

import sys

import apache_beam as beam

from beam_supertable import WriteToSupertable
from tests.beam_supertable.test_transforms import _elements


def main(uri, start, n):
    with beam.Pipeline() as p:
        _ = p | beam.Create(_elements(int(n), start=int(start)), reshuffle=False) | \
            WriteToSupertable(uri)


if __name__ == "__main__":
    main(*sys.argv[1:])
