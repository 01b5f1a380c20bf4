"""One UpsertToSupertable run in its own process, optionally dying around the commit.

    python -m tests.beam_supertable.upsert_proc URI none|before|after

``before``: the process exits (status 17, no cleanup) when the job's commit
is about to be created; ``after``: right after it landed. The crash is
injected by wrapping ``Manifest.commit`` here, in the test process, not by a
hook in the library.
"""

import os
import sys

import apache_beam as beam

from beam_supertable import UpsertToSupertable
from beam_supertable.format.manifest import Manifest
from tests.beam_supertable.test_upsert_write import CRASH_BATCH, SCHEMA, _commands

CRASH_STATUS = 17


def _crash_around_commits(when: str) -> None:
    original = Manifest.commit

    def commit(self, req, **kwargs):
        if req.operation != "upsert":
            return original(self, req, **kwargs)
        if when == "before":
            os._exit(CRASH_STATUS)
        landed = original(self, req, **kwargs)
        os._exit(CRASH_STATUS)
        return landed

    Manifest.commit = commit


def main(uri: str, crash: str) -> None:
    if crash != "none":
        _crash_around_commits(crash)
    with beam.Pipeline() as p:
        _ = (p | beam.Create(_commands(CRASH_BATCH))
             | UpsertToSupertable(uri, schema=SCHEMA, primary_key="id", vector_column="emb"))


if __name__ == "__main__":
    main(*sys.argv[1:])
