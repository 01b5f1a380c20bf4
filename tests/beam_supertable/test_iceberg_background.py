"""The Iceberg metadata is written beside the commit: commits do not wait for it, readers do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pyarrow as pa
import pytest

from beam_supertable import Supertable
from beam_supertable.iceberg import background, metadata as iceberg
from tests.beam_supertable.iceberg_reads import (
    assert_every_version_reads_alike, iceberg_scan, rows_of)

pytest.importorskip("pyiceberg.table")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64())])


def rows(keys, n):
    keys = list(keys)
    return pa.table({"key": [str(k) for k in keys], "n": [int(n)] * len(keys)}, schema=SCHEMA)


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_a_commit_returns_before_its_metadata_and_a_reader_waits_for_it(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    background.drain()
    release, started = threading.Event(), threading.Event()
    real = iceberg.IcebergMetadata.write

    def held(self, snapshot, **kw):
        started.set()
        assert release.wait(60)
        return real(self, snapshot, **kw)

    monkeypatch.setattr(iceberg.IcebergMetadata, "write", held)
    assert t.upsert(rows(range(3), 2)) == 2     # returned while the metadata is held
    assert started.wait(60)
    assert not os.path.exists(f"{uri}/metadata/v2.metadata.json")
    found = []
    reader = threading.Thread(target=lambda: found.append(t.iceberg_metadata_location()))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and not found            # it waits for this process's writer
    release.set()
    reader.join(60)
    assert found == [f"{uri}/metadata/v2.metadata.json"]
    monkeypatch.undo()
    assert rows_of(iceberg_scan(found[0]).to_arrow().select(["_id", "key", "n"])) == \
        rows_of(Supertable.open(uri).to_arrow().select(["_id", "key", "n"]))


def test_a_process_that_exits_after_its_commits_has_written_their_metadata(tmp_path):
    uri = str(tmp_path / "t")
    done = run_python(f"""
        import pyarrow as pa
        from beam_supertable import Supertable
        schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
        t = Supertable.create({uri!r}, schema, primary_key="key")
        for n in range(25):
            t.upsert(pa.table({{"key": [str(n % 7)], "n": [n]}}, schema=schema))
        print(t.version)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "25"
    # Nothing of ours ran after the process: what it queued was written as it exited.
    assert open(f"{uri}/metadata/version-hint.text").read() == "25"
    assert json.load(open(f"{uri}/metadata/v25.metadata.json"))["current-snapshot-id"] == 25
    assert_every_version_reads_alike(uri)


def test_a_writer_killed_after_its_commit_leaves_metadata_a_reader_writes(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    background.drain()
    # The writer dies the moment its commit returns, before its metadata thread ran.
    done = run_python(f"""
        import os
        import pyarrow as pa
        from beam_supertable import Supertable
        from beam_supertable.iceberg import background
        background.submit = lambda uri, write: None
        schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
        t = Supertable.open({uri!r})
        print(t.upsert(pa.table({{"key": ["3", "40"], "n": [2, 2]}}, schema=schema)),
              flush=True)
        os._exit(0)
    """)
    assert done.stdout.split() == ["2"], done.stderr
    assert not os.path.exists(f"{uri}/metadata/v2.metadata.json")
    assert open(f"{uri}/metadata/version-hint.text").read() == "1"   # Iceberg sees 1 whole
    location = Supertable.open(uri).iceberg_metadata_location()
    assert location == f"{uri}/metadata/v2.metadata.json"
    assert_every_version_reads_alike(uri)


def test_commits_from_many_threads_each_get_their_metadata_in_order(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, primary_key="key")
    errors = []

    def write(worker):
        try:
            table = Supertable.open(uri)
            for n in range(8):
                table.upsert(rows([f"{worker}-{n}", "shared"], worker * 100 + n))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    background.drain()
    assert open(f"{uri}/metadata/version-hint.text").read() == "24"
    assert_every_version_reads_alike(uri)
