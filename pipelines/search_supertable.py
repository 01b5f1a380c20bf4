"""``python -m pipelines.search_supertable``: the job in :mod:`beam_supertable.jobs.search_supertable`."""

if __name__ == "__main__":
    from beam_supertable.jobs._launch import launch
    raise SystemExit(launch("search_supertable"))
from beam_supertable.jobs.search_supertable import *  # noqa: E402,F401,F403
