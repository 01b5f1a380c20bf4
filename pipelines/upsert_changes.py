"""``python -m pipelines.upsert_changes``: the job in :mod:`beam_supertable.jobs.upsert_changes`."""

if __name__ == "__main__":
    from beam_supertable.jobs._launch import launch
    raise SystemExit(launch("upsert_changes"))
from beam_supertable.jobs.upsert_changes import *  # noqa: E402,F401,F403
