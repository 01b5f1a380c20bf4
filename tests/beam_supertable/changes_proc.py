"""A real process tailing a table's changes, as a long-running consumer would.

    python -m tests.beam_supertable.changes_proc URI START_VERSION OUT

Runs ``ReadChangesFromSupertable(URI, start_version=START_VERSION)`` with no end
on the DirectRunner and appends one JSON line ``[key, row, diff]`` per change to
OUT as it arrives; it runs until it is killed.
"""

import json
import sys

import apache_beam as beam

from beam_supertable import ReadChangesFromSupertable


class _Append(beam.DoFn):
    def __init__(self, path):
        self._path = path

    def setup(self):
        self._out = open(self._path, "a", encoding="utf-8")

    def process(self, change):
        self._out.write(json.dumps([change.key, change.value, change.diff]) + "\n")
        self._out.flush()


def main(argv):
    uri, start, out = argv[0], int(argv[1]), argv[2]
    with beam.Pipeline() as p:
        _ = (p | ReadChangesFromSupertable(uri, start_version=start, poll_interval=0.05)
             | beam.ParDo(_Append(out)))


if __name__ == "__main__":
    main(sys.argv[1:])
