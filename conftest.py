"""Routes the flink-marked tests to the environment that can run them.

Beam's Flink job server and the SDK must be the same release, and the newest
job server this machine can assemble (``<beam.version>`` in flink/pom.xml) is
older than the apache-beam users and the default environment run. So in any
other environment the flink tests are set aside: ``./scripts/test`` collects
their ids (``$BEAM_PLUGIN_FLINK_PENDING``) and runs them in ``.venv-flink``;
run by hand, they are skipped with the reason.
"""

import os

import apache_beam
import pytest

PENDING_ENV = "BEAM_PLUGIN_FLINK_PENDING"


def _job_server_release():
    from beam_supertable.jobs.flink import job_server_beam_version
    return job_server_beam_version()


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected what they drop
def pytest_collection_modifyitems(config, items):
    flink_items = [i for i in items if i.get_closest_marker("flink")]
    release = _job_server_release()
    if not flink_items or apache_beam.__version__ == release:
        return
    pending = os.environ.get(PENDING_ENV)
    if pending:
        with open(pending, "w", encoding="utf-8") as f:
            f.writelines(i.nodeid + "\n" for i in flink_items)
        chosen = set(map(id, flink_items))
        config.hook.pytest_deselected(items=flink_items)
        items[:] = [i for i in items if id(i) not in chosen]
        return
    skip = pytest.mark.skip(reason=(
        f"needs apache-beam {release} (the Flink job server's release), this is "
        f"{apache_beam.__version__}; ./scripts/test runs it in .venv-flink"))
    for item in flink_items:
        item.add_marker(skip)


# A Flink job that stops making progress (a bundle waiting on a worker that
# never answers) would otherwise hold the whole run until CI's own limit; the
# longest flink test takes about 3 minutes.
FLINK_TEST_LIMIT_S = 900


@pytest.fixture(autouse=True)
def _flink_time_limit(request):
    import signal
    if not request.node.get_closest_marker("flink") or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _expired(signum, frame):
        pytest.fail(f"{request.node.nodeid} ran past {FLINK_TEST_LIMIT_S} s", pytrace=True)

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(FLINK_TEST_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
