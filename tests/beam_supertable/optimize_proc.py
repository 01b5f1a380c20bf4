"""A real process optimizing a table while other processes write to it.

    python -m tests.beam_supertable.optimize_proc URI OPTIONS_JSON ROUNDS

It opens the table, prints READY and waits for a line on stdin, so that it
starts with the writers. Each round runs ``optimize`` (every round finds the
writers' new superfiles and deletion vectors to rewrite) and prints one JSON line with the version returned (null when there
was nothing to do); at the end how many commits rebased past a concurrent
write (``RACED n``: lost races, deletes carried over, re-plans) and ``DONE``.
"""

import json
import logging
import sys
import time

from beam_supertable import Supertable


def main(argv):
    uri, options, rounds = argv[0], json.loads(argv[1]) or None, int(argv[2])
    raced = _Counter(("retrying", "carries", "planning again"))
    for name in ("beam_supertable.format.manifest", "beam_supertable.table.optimize"):
        logging.getLogger(name).addHandler(raced)
        logging.getLogger(name).setLevel(logging.INFO)
    table = Supertable.open(uri, storage_options=options)
    print("READY", flush=True)
    sys.stdin.readline()
    for _ in range(rounds):
        table.refresh()
        before = table.version
        version = table.optimize()
        print(json.dumps({"version": version}), flush=True)
        # The next round waits (a while) for a writer's commit, so that each round has
        # something to rewrite however fast the writers are on a loaded machine.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.05)
            table.refresh()
            if table.version > (before if version is None else version):
                break
    print(f"RACED {raced.count}", flush=True)
    print("DONE", flush=True)


class _Counter(logging.Handler):
    """Counts log records saying a commit met a concurrent one."""

    def __init__(self, words):
        super().__init__()
        self.words, self.count = words, 0

    def emit(self, record):
        if any(w in record.getMessage() for w in self.words):
            self.count += 1


if __name__ == "__main__":
    main(sys.argv[1:])
