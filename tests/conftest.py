"""Shared fixtures: storage backends, including a real S3-protocol server."""

import logging
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

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
