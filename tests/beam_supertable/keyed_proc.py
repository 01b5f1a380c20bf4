"""A real writer process racing others on one keyed table.

    python -m tests.beam_supertable.keyed_proc URI OPTIONS_JSON WRITER ROUNDS KEYS DELETES

It opens the table, prints READY and waits for a line on stdin, so that all
writers start together. Each round upserts a random half of keys ``0 .. KEYS-1`` with the label
``WRITER/round`` (or, every other round when DELETES is 1, deletes a random
quarter of them by key), and prints one JSON line per call: the token, the
operation, the keys and the version returned; at the end, how many commit
attempts lost a race (``RETRIES n``).
"""

import json
import logging
import random
import sys

import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import Supertable


def main(argv):
    uri, options, writer = argv[0], json.loads(argv[1]) or None, argv[2]
    rounds, n_keys, deletes = int(argv[3]), int(argv[4]), argv[5] == "1"
    retries = _RetryCounter()
    logging.getLogger("beam_supertable.format.manifest").addHandler(retries)
    logging.getLogger("beam_supertable.format.manifest").setLevel(logging.INFO)
    table = Supertable.open(uri, storage_options=options)
    print("READY", flush=True)
    sys.stdin.readline()
    for r in range(rounds):
        rng = random.Random(f"{writer}/{r}")
        token = f"{writer}/{r}"
        if deletes and r % 2:
            keys = sorted(rng.sample(range(n_keys), n_keys // 4))
            version = table.delete(pc.field("id").isin(keys), token=token, max_retries=100)
            op = "delete"
        else:
            keys = sorted(rng.sample(range(n_keys), n_keys // 2))
            rows = pa.table({"id": pa.array(keys, pa.int64()), "label": [token] * len(keys)})
            # Several writers on one table lose many races; a generous budget
            # keeps each going (the token keeps a retry from landing twice).
            version = table.upsert(rows, token=token, max_retries=100)
            op = "upsert"
        print(json.dumps({"token": token, "op": op, "keys": keys, "version": version}), flush=True)
    print(f"RETRIES {retries.count}", flush=True)
    print("DONE", flush=True)


class _RetryCounter(logging.Handler):
    """Counts the commit loop's "retrying" log records: lost races."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        if "retrying" in record.getMessage():
            self.count += 1


if __name__ == "__main__":
    main(sys.argv[1:])
