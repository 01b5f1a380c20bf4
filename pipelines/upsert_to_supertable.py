"""``python -m pipelines.upsert_to_supertable``: the job in :mod:`beam_supertable.jobs.upsert_to_supertable`."""

if __name__ == "__main__":
    from beam_supertable.jobs._launch import launch
    raise SystemExit(launch("upsert_to_supertable"))
from beam_supertable.jobs.upsert_to_supertable import *  # noqa: E402,F401,F403
