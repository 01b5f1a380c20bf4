"""``python -m pipelines.optimize_supertable``: the job in :mod:`beam_supertable.jobs.optimize_supertable`."""

if __name__ == "__main__":
    from beam_supertable.jobs._launch import launch
    raise SystemExit(launch("optimize_supertable"))
from beam_supertable.jobs.optimize_supertable import *  # noqa: E402,F401,F403
