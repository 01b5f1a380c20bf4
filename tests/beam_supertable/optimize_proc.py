"""A real process optimizing a table while other processes write to it.

    python -m tests.beam_supertable.optimize_proc URI OPTIONS_JSON ROUNDS

It opens the table, prints READY and waits for a line on stdin, so that it
starts with the writers. Each round runs ``optimize`` (every round finds the
writers' new superfiles and deletion vectors to rewrite) and prints one JSON line with the version returned (null when there
was nothing to do); at the end, ``DONE``.
"""

import json
import sys
import time

from beam_supertable import Supertable


def main(argv):
    uri, options, rounds = argv[0], json.loads(argv[1]) or None, int(argv[2])
    table = Supertable.open(uri, storage_options=options)
    print("READY", flush=True)
    sys.stdin.readline()
    for _ in range(rounds):
        table.refresh()
        version = table.optimize()
        print(json.dumps({"version": version}), flush=True)
        time.sleep(0.05)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
