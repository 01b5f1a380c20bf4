"""A real writer process merging into one keyed table while others do.

    python -m tests.beam_supertable.merge_proc URI WRITER ROUNDS KEYS DELETES

It opens the table, prints READY and waits for a line on stdin, so that all
writers start together. Each round merges a random half of keys
``0 .. KEYS-1`` (values ``v`` random in 0..9, ``ts`` the round): matched rows
are updated where the source is newer, others inserted; with DELETES 1, target
rows the source lacks are deleted where ``v > 5``. One JSON line per call
(token, rows, clauses, counts, version); at the end the lost races.
"""

import json
import logging
import random
import sys

import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import Supertable
from tests.beam_supertable.keyed_proc import _RetryCounter


def main(argv):
    uri, writer, rounds, n_keys, delete = argv[0], argv[1], int(argv[2]), int(argv[3]), \
        argv[4] == "1"
    retries = _RetryCounter()
    logging.getLogger("beam_supertable.format.manifest").addHandler(retries)
    logging.getLogger("beam_supertable.format.manifest").setLevel(logging.INFO)
    replans = _RetryCounter()
    replans.emit = lambda record: setattr(replans, "count", replans.count + (
        "re-planned" in record.getMessage()))
    logging.getLogger("beam_supertable.table.merge_insert").addHandler(replans)
    logging.getLogger("beam_supertable.table.merge_insert").setLevel(logging.INFO)
    table = Supertable.open(uri)
    print("READY", flush=True)
    sys.stdin.readline()
    for r in range(rounds):
        rng = random.Random(f"{writer}/{r}")
        token = f"{writer}/{r}"
        keys = sorted(rng.sample(range(n_keys), n_keys // 2))
        rows = [(k, rng.randrange(10), r) for k in keys]
        b = (table.merge_insert()
             .when_matched_update_all(where=pc.field("source.ts") > pc.field("target.ts"))
             .when_not_matched_insert_all())
        if delete:
            b = b.when_not_matched_by_source_delete(where=pc.field("v") > 5)
        result = b.execute(pa.table({"k": pa.array([x[0] for x in rows], pa.int64()),
                                     "v": pa.array([x[1] for x in rows], pa.int64()),
                                     "ts": pa.array([x[2] for x in rows], pa.int64())}),
                           token=token, max_retries=100)
        counts = [result.num_inserted_rows, result.num_updated_rows, result.num_deleted_rows]
        print(json.dumps({"token": token, "rows": rows, "delete": delete, "counts": counts,
                          "version": result.version}), flush=True)
    print(f"REPLANS {replans.count}", flush=True)
    print(f"RETRIES {retries.count}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
