"""Real OS processes: concurrent committers, and a writer killed mid-commit."""

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from beam_supertable import Supertable
from beam_supertable.format.documents import version_path
from beam_supertable.format.manifest import Manifest
from beam_supertable.format.store import ObjectStore
from tests.beam_supertable.iceberg_reads import assert_every_version_reads_alike
from tests.conftest import BACKENDS, backend_location

SCHEMA = pa.schema([("writer", pa.string()), ("seq", pa.int64())])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITERS, COMMITS = 8, 25
# Vacuum's contract: its grace outlasts any upload-to-commit window (a commit that loses
# races for longer than the grace can find its superfile or part vacuumed).
VACUUM_GRACE_S = 60


def _spawn(*args):
    return subprocess.Popen([sys.executable, "-m", "tests.beam_supertable.writer_proc", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path):
    return backend_location(request, request.param, tmp_path)


@pytest.mark.slow
def test_eight_processes_commit_200_versions_without_gaps_while_vacuum_runs(location, tmp_path):
    uri, options = location
    Supertable.create(uri, SCHEMA, storage_options=options)
    stop = tmp_path / "stop-vacuum"
    vacuum = _spawn("vacuum", uri, json.dumps(options), str(stop), str(VACUUM_GRACE_S))
    procs = [_spawn("append", uri, json.dumps(options), f"w{i}", str(COMMITS))
             for i in range(WRITERS)]
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        assert "DONE" in out
    stop.touch()
    out, err = vacuum.communicate(timeout=300)
    assert vacuum.returncode == 0, err[-3000:]
    removed = int(out.split()[1])
    store = ObjectStore(uri, options)
    manifest = Manifest(store)
    assert manifest.latest_version() == WRITERS * COMMITS
    history = manifest.history()
    oldest = history[0]["version"]
    # Versions vacuum removed are the oldest ones; the rest hold no gap.
    assert [h["version"] for h in history] == list(range(oldest, WRITERS * COMMITS + 1))
    assert oldest == (removed if removed else 0)
    for v in range(oldest, WRITERS * COMMITS + 1):
        assert store.exists(version_path(v)), f"gap at version {v}"
    rows = Supertable.open(uri, storage_options=options).to_arrow().to_pylist()
    seen = sorted((r["writer"], r["seq"]) for r in rows)
    assert seen == sorted((f"w{i}", s) for i in range(WRITERS) for s in range(COMMITS))
    tokens = [h["token"] for h in history if h["version"] > 0]
    assert len(tokens) == len(set(tokens))
    # And so do Iceberg readers (each 10th version on a server: reading all 200 there
    # takes minutes, and every version is checked on local disk).
    assert_every_version_reads_alike(uri, options, every=1 if options is None else 10)


def test_writer_killed_before_commit_leaves_the_table_whole(location):
    uri, options = location
    table = Supertable.create(uri, SCHEMA, storage_options=options)
    table.append(pa.table({"writer": ["kept"], "seq": [1]}))
    table.iceberg_metadata_location()     # written beside the commit: wait for it
    before = {o.path for o in ObjectStore(uri, options).list("")}
    proc = _spawn("upload-then-hang", uri, json.dumps(options))
    line = proc.stdout.readline()
    assert line.strip() == "UPLOADED", proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    store = ObjectStore(uri, options)
    new = {o.path for o in store.list("")} - before
    # The writer claimed an id range (kept forever) and uploaded one superfile.
    claims = {p for p in new if p.startswith("_supertable/ids/")}
    orphans = new - claims
    assert len(claims) == 1
    assert len(orphans) == 1 and next(iter(orphans)).startswith("data/")
    reopened = Supertable.open(uri, storage_options=options)
    assert reopened.version == 1
    assert reopened.to_arrow().to_pylist()[0]["writer"] == "kept"
    report = reopened.vacuum(retain_versions=10, older_than=0)
    assert set(report.removed_objects) == orphans
    assert {o.path for o in store.list("")} == before - {"_supertable/latest.json"} | (
        before & {"_supertable/latest.json"}) | claims
    assert Supertable.open(uri, storage_options=options).to_arrow().num_rows == 1
