"""Shared fixtures: storage backends, each a real server in its own process.

The S3 server (moto), SeaweedFS (a real S3-compatible server), Azurite (Azure
Blob Storage) and fake-gcs-server (Google Cloud Storage); the last three are
installed by ``./scripts/store-servers`` (see ``tests/store_servers.py``).
"""

import logging
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests import store_servers

# Outside readers (pyiceberg's gcsfs) in this process: gcsfs's experimental
# zonal-bucket check tries gRPC first and waits a minute against an emulator.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

_LOG = logging.getLogger(__name__)
S3_CREDENTIALS = {"key": "testing", "secret": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A moto standalone S3 server process on 127.0.0.1.

    MinIO is AGPL-licensed and its module is not one this project may build
    here, so the fixture runs moto's server, a separate OS process speaking
    the S3 protocol, conditional writes included; ``tests/s3_server.py`` makes
    those atomic as on S3 (moto checks, then writes, on a threaded server).
    """
    port = _free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "tests.s3_server", "127.0.0.1", str(port)],
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("moto_server did not start within 30 s")
    import moto
    print(f"\nS3 server: moto {moto.__version__} standalone server at {endpoint}")
    yield endpoint
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def s3_options(endpoint: str) -> dict:
    return {**S3_CREDENTIALS,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


@pytest.fixture
def s3_bucket(s3_server):
    import boto3

    name = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory):
    """SeaweedFS (``weed server -s3``): an S3-compatible server built to refuse a
    second conditional create atomically, answering ``412`` in its own words."""
    server = store_servers.start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory):
    """Azurite, Microsoft's Azure Blob Storage emulator (blob service only)."""
    server = store_servers.start_azurite(tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server, a Google Cloud Storage emulator (in memory)."""
    server = store_servers.start_fake_gcs(tmp_path_factory.mktemp("fake-gcs"))
    yield server
    server.stop()


# Every backend a table is written to: local disk and four servers.
BACKENDS = ("local", "s3", "seaweedfs", "azure", "gcs")
REMOTE_BACKENDS = BACKENDS[1:]


def backend_location(request, backend: str, tmp_path, name: str = "table"):
    """(uri, storage_options) of a fresh table location on ``backend``."""
    if backend == "local":
        return str(tmp_path / name), None
    if backend == "s3":
        endpoint = request.getfixturevalue("s3_server")
        return f"s3://{request.getfixturevalue('s3_bucket')}/{name}", s3_options(endpoint)
    if backend == "seaweedfs":
        server = request.getfixturevalue("seaweedfs_server")
        return (f"s3://{store_servers.seaweed_bucket(server)}/{name}",
                store_servers.seaweed_options(server))
    if backend == "azure":
        server = request.getfixturevalue("azurite_server")
        return (f"az://{store_servers.azure_container(server)}/{name}",
                store_servers.azure_options(server))
    if backend == "gcs":
        server = request.getfixturevalue("gcs_server")
        return (f"gs://{store_servers.gcs_bucket(server)}/{name}",
                store_servers.gcs_options(server))
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def store_location(request, tmp_path):
    """(uri, storage_options) of a fresh table location on every backend."""
    return backend_location(request, request.param, tmp_path)


@pytest.fixture(params=REMOTE_BACKENDS)
def remote_location(request, tmp_path):
    """(uri, storage_options) of a fresh table location on every server."""
    return backend_location(request, request.param, tmp_path)


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def table_location(request, tmp_path):
    """(uri, storage_options) of a fresh table location on each backend."""
    if request.param == "local":
        yield str(tmp_path / "table"), None
        return
    if request.param == "memory":
        uri = f"memory://tests/{uuid.uuid4().hex}"
        yield uri, None
        import fsspec
        fs = fsspec.filesystem("memory")
        if fs.exists(uri):
            fs.rm(uri, recursive=True)
        return
    endpoint = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    yield f"s3://{bucket}/table", s3_options(endpoint)


@pytest.fixture
def fault_proxy(s3_server):
    """A fault-injecting TCP proxy process in front of the S3 server.

    It forwards everything untouched until a test configures faults
    (``fault_proxy.configure(share=..., kinds=..., seed=...)``); clients reach
    it at ``fault_proxy.url``. See ``tests/beam_supertable/fault_proxy.py``.
    """
    from tests.beam_supertable.fault_proxy import FaultProxy

    proxy = FaultProxy(s3_server)
    yield proxy
    proxy.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    # What the test committed gets its Iceberg metadata (written beside each commit)
    # before the test's servers, proxies and folders are torn down.
    background = sys.modules.get("beam_supertable.iceberg.background")
    if background is not None:
        background.drain(timeout=60)
