"""A real writer process for the concurrency and crash tests.

    python -m tests.beam_supertable.writer_proc append URI OPTIONS_JSON WRITER N
    python -m tests.beam_supertable.writer_proc append-constant-random URI OPTIONS_JSON WRITER N
    python -m tests.beam_supertable.writer_proc upload-then-hang URI OPTIONS_JSON
    python -m tests.beam_supertable.writer_proc vacuum URI OPTIONS_JSON STOP_FILE GRACE_S [RETAIN]
"""

import json
import sys
import time

import pyarrow as pa

from beam_supertable import Supertable


def main(argv):
    import logging
    import os
    if os.environ.get("WRITER_LOG"):
        logging.basicConfig(level=logging.INFO)
    mode, uri, options = argv[0], argv[1], json.loads(argv[2]) or None
    table = Supertable.open(uri, storage_options=options)
    if mode == "append-constant-random":
        # Every process draws the same "random" numbers (the id test's worst case).
        import secrets
        secrets.randbits = lambda bits: 12345
        mode = "append"
    if mode == "append":
        writer, n = argv[3], int(argv[4])
        for seq in range(n):
            # Eight writers on one table lose many races; a generous budget
            # keeps every writer going (the token keeps retries exact).
            table.append(pa.table({"writer": [writer], "seq": [seq]}),
                         token=f"{writer}/{seq}", max_retries=100)
        print("DONE", flush=True)
    elif mode == "vacuum":
        # Vacuums while the writers race, until told to stop; the grace outlasts
        # any commit's upload-to-commit window, as it must in production.
        stop, grace = argv[3], float(argv[4])
        retain = int(argv[5]) if len(argv) > 5 else 10
        removed, rounds = 0, 0
        while True:
            # One more round once the writers are done: a metadata file a writer wrote
            # while a vacuum ran may still list snapshots that vacuum removed.
            done = os.path.exists(stop)
            report = table.vacuum(retain_versions=retain, older_than=grace)
            removed += len(report.removed_versions)
            rounds += 1
            if done:
                break
            time.sleep(0.5)
        print(f"VACUUMED {removed} {rounds}", flush=True)
    elif mode == "upload-then-hang":
        table.write_superfiles(pa.table({"writer": ["doomed"], "seq": [0]}))
        print("UPLOADED", flush=True)
        time.sleep(600)  # the test kills us here, before the commit


if __name__ == "__main__":
    main(sys.argv[1:])
