"""``python -m beam_supertable``: see :mod:`beam_supertable.cli`."""

import sys

from beam_supertable.cli import main

if __name__ == "__main__":
    sys.exit(main())
