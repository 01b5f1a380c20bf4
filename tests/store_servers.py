"""The object-store servers the tests write to, each in its own OS process.

``./scripts/store-servers`` installs them from pinned versions into a cache
outside the repository; these helpers start one on 127.0.0.1 and give the
``storage_options`` a table on it takes:

* fake-gcs-server (Google Cloud Storage, ``gs://``), through gcsfs;
* Azurite (Azure Blob Storage, ``az://``), through adlfs;
* SeaweedFS (an S3-compatible server, ``s3://``), through s3fs.

A server that is not installed fails the test that needs it, naming the
script: nothing here is skipped.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import time
import uuid
from typing import Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The well-known development account every Azure Storage emulator accepts.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
SEAWEED_CREDENTIALS = {"key": "seaweed", "secret": "seaweed"}


class NotInstalled(RuntimeError):
    pass


def cache_folder() -> pathlib.Path:
    """Where ``scripts/store-servers`` installs the servers (it says)."""
    done = subprocess.run([str(ROOT / "scripts" / "store-servers"), "--folder"],
                          capture_output=True, text=True, timeout=60, check=True)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def _binary(pattern: str) -> str:
    found = sorted(cache_folder().glob(pattern))
    if not found:
        raise NotInstalled(f"no {pattern} under {cache_folder()}: run ./scripts/store-servers "
                           "(./scripts/test does)")
    return str(found[-1])


def free_port(also: int = 0) -> int:
    """A free port on 127.0.0.1 (and, with ``also``, port + ``also`` free too)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not also or port + also > 65535:
            if not also:
                return port
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + also))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


class Server:
    """A server process; ``stop()`` ends it and removes its folder."""

    def __init__(self, name: str, argv: List[str], port: int, folder: pathlib.Path,
                 env: Optional[Dict[str, str]] = None, ready=None, timeout: float = 60) -> None:
        self.name, self.port, self.folder = name, port, folder
        self.endpoint = f"http://127.0.0.1:{port}"
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / f"{name}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})}, cwd=folder)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                if ready is None or ready(self):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{name} did not start within {timeout:.0f} s: "
                           f"{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


# -- Google Cloud Storage ----------------------------------------------------
def start_fake_gcs(folder: pathlib.Path) -> Server:
    port = free_port()
    return Server("fake-gcs-server", [
        _binary("fake-gcs-server-*/fake-gcs-server"), "-scheme", "http", "-host", "127.0.0.1",
        "-port", str(port), "-backend", "memory", "-public-host", f"127.0.0.1:{port}",
        "-external-url", f"http://127.0.0.1:{port}", "-log-level", "error"], port, folder)


def gcs_options(server: Server) -> dict:
    return {"endpoint_url": server.endpoint, "token": "anon", "project": "test"}


def gcs_bucket(server: Server) -> str:
    import requests

    name = f"t-{uuid.uuid4().hex[:12]}"
    requests.post(f"{server.endpoint}/storage/v1/b", params={"project": "test"},
                  json={"name": name}, timeout=30).raise_for_status()
    return name


# -- Azure Blob Storage ------------------------------------------------------
def start_azurite(folder: pathlib.Path) -> Server:
    port = free_port()
    return Server("azurite", [
        _binary("azurite-*/node_modules/.bin/azurite-blob"), "--blobHost", "127.0.0.1",
        "--blobPort", str(port), "--inMemoryPersistence",
        "--skipApiVersionCheck", "--loose", "--silent"], port, folder)


def azure_connection_string(server: Server) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={server.endpoint}/{AZURITE_ACCOUNT};")


def azure_options(server: Server) -> dict:
    return {"account_name": AZURITE_ACCOUNT, "connection_string": azure_connection_string(server)}


def azure_container(server: Server) -> str:
    from azure.storage.blob import BlobServiceClient

    name = f"t-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(
        azure_connection_string(server)).create_container(name)
    return name


# -- SeaweedFS (S3) ----------------------------------------------------------
def start_seaweedfs(folder: pathlib.Path) -> Server:
    # weed listens on each port and on port + 10000 (gRPC).
    master, volume, filer, s3 = (free_port(also=10000) for _ in range(4))
    (folder / "data").mkdir(parents=True, exist_ok=True)

    def s3_ready(server: Server) -> bool:
        import requests
        try:
            return requests.get(server.endpoint, timeout=2).status_code < 500
        except requests.RequestException:
            return False

    return Server("seaweedfs", [
        _binary("seaweedfs-*/weed"), "server", f"-dir={folder / 'data'}", "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1", f"-master.port={master}", f"-volume.port={volume}",
        f"-filer.port={filer}", "-s3", f"-s3.port={s3}", "-master.volumeSizeLimitMB=64",
        "-volume.max=0", "-master.raftHashicorp"], s3, folder, ready=s3_ready, timeout=120)


def seaweed_options(server: Server) -> dict:
    return {**SEAWEED_CREDENTIALS,
            "client_kwargs": {"endpoint_url": server.endpoint, "region_name": "us-east-1"}}


def seaweed_bucket(server: Server) -> str:
    import boto3

    name = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                 aws_access_key_id=SEAWEED_CREDENTIALS["key"],
                 aws_secret_access_key=SEAWEED_CREDENTIALS["secret"]).create_bucket(Bucket=name)
    return name
