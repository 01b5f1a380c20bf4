"""A real process changing a table's shape, for the racing-writers test.

    python -m tests.beam_supertable.evolve_proc upsert URI COLUMN FIRST_KEY N
    python -m tests.beam_supertable.evolve_proc add URI COLUMN

``upsert`` upserts N rows (keys FIRST_KEY…) one commit each with
``schema_mode="merge"``, each row carrying COLUMN; ``add`` adds COLUMN.
"""

import sys

import pyarrow as pa

from beam_supertable import Supertable


def main(argv):
    mode, uri, column = argv[0], argv[1], argv[2]
    table = Supertable.open(uri)
    if mode == "add":
        table.add_columns(pa.field(column, pa.string()))
        return
    first, n = int(argv[3]), int(argv[4])
    for key in range(first, first + n):
        table.upsert([{"k": key, "v": key, column: f"{column}{key}"}], schema_mode="merge")


if __name__ == "__main__":
    main(sys.argv[1:])
