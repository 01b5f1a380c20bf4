"""A whole Beam pipeline in its own process, for the concurrent-writers tests.

    python -m tests.beam_supertable.pipeline_proc URI START N [create]

With ``create`` the transform gets the schema and settings, so a missing
table is created inside the pipeline.
"""

import sys

import apache_beam as beam

from beam_supertable import WriteToSupertable
from tests.beam_supertable.test_transforms import SCHEMA, _elements


def main(uri, start, n, mode=""):
    settings = {"schema": SCHEMA, "vector_column": "emb", "fts_columns": ["body"]} \
        if mode == "create" else {}
    with beam.Pipeline() as p:
        _ = p | beam.Create(_elements(int(n), start=int(start)), reshuffle=False) | \
            WriteToSupertable(uri, **settings)


if __name__ == "__main__":
    main(*sys.argv[1:])
