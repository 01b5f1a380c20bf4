"""``python -m pipelines.load_supertable``: the job in :mod:`beam_supertable.jobs.load_supertable`."""

if __name__ == "__main__":
    from beam_supertable.jobs._launch import launch
    raise SystemExit(launch("load_supertable"))
from beam_supertable.jobs.load_supertable import *  # noqa: E402,F401,F403
