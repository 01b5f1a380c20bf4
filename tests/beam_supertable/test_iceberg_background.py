"""The Iceberg metadata is written beside the commit: commits do not wait for it, readers do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

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


def hold_metadata(monkeypatch):
    """Every metadata write waits for ``release``; ``started`` is set when one begins.
    Returns (release, started, the real write)."""
    release, started = threading.Event(), threading.Event()
    real = iceberg.IcebergMetadata.write

    def held(self, snapshot, **kw):
        started.set()
        assert release.wait(60)
        return real(self, snapshot, **kw)

    monkeypatch.setattr(iceberg.IcebergMetadata, "write", held)
    return release, started, real


def test_a_commit_returns_before_its_metadata_and_a_reader_waits_for_it(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    background.drain()
    release, started, real = hold_metadata(monkeypatch)
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
        for n in range(12):
            t.upsert(pa.table({{"key": [str(n % 7)], "n": [n]}}, schema=schema))
        print(t.version)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "12"
    # Nothing of ours ran after the process: what it queued was written as it exited.
    assert open(f"{uri}/metadata/version-hint.text").read() == "12"
    assert json.load(open(f"{uri}/metadata/v12.metadata.json"))["current-snapshot-id"] == 12
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
            for n in range(5):
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
    assert open(f"{uri}/metadata/version-hint.text").read() == "15"
    assert_every_version_reads_alike(uri)


def test_a_backlog_at_exit_is_written_before_the_process_ends(tmp_path):
    uri = str(tmp_path / "t")
    done = run_python(f"""
        import time
        import pyarrow as pa
        from beam_supertable import Supertable
        from beam_supertable.iceberg import metadata
        real = metadata.IcebergMetadata.write

        def slow(self, snapshot, **kw):     # a slow store: the queue is still full at exit
            time.sleep(0.3)
            return real(self, snapshot, **kw)

        metadata.IcebergMetadata.write = slow
        schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
        t = Supertable.create({uri!r}, schema, primary_key="key")
        for n in range(4):
            t.upsert(pa.table({{"key": [f"{{n}}-a", f"{{n}}-b"], "n": [n] * 2}}, schema=schema))
        # Rows of two superfiles replaced: two position files, written by a pool.
        t.upsert(pa.table({{"key": ["0-a", "1-a"], "n": [9, 9]}}, schema=schema))
        print(t.version)
    """)
    assert done.returncode == 0, done.stderr
    assert "unwritten" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert done.stdout.split()[-1] == "5"
    assert open(f"{uri}/metadata/version-hint.text").read() == "5"
    assert_every_version_reads_alike(uri)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_the_metadata_is_written_reads_it_without_hanging(tmp_path,
                                                                              monkeypatch):
    import multiprocessing
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    release, started, real = hold_metadata(monkeypatch)
    t.upsert(rows(range(5), 1))
    assert started.wait(60)       # the parent's metadata thread holds the view's lock
    monkeypatch.setattr(iceberg.IcebergMetadata, "write", real)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child_reads_metadata, args=(t, uri))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    release.set()
    background.drain()
    assert not alive and child.exitcode == 0


def _child_reads_metadata(table, uri):
    assert table.iceberg_metadata_location() == f"{uri}/metadata/v1.metadata.json"
    os._exit(0)


@pytest.mark.parametrize("vacuum_from", ["another process", "another spelling of the uri"])
def test_a_vacuum_right_after_a_commit_keeps_what_its_metadata_names(tmp_path, monkeypatch,
                                                                     vacuum_from):
    import pyarrow.compute as pc
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    t.delete(pc.field("key") == "3")          # a delete manifest the next version reuses
    background.drain()
    release, _, real = hold_metadata(monkeypatch)
    t.upsert(rows([20, 21], 4))               # version 3: its metadata is held
    if vacuum_from == "another process":
        done = run_python(f"""
            from beam_supertable import Supertable
            Supertable.open({uri!r}).vacuum(retain_versions=1, older_than=0)
        """)
        assert done.returncode == 0, done.stderr
    else:
        monkeypatch.setattr(iceberg.IcebergMetadata, "write", real)
        Supertable.open(uri + "/").vacuum(retain_versions=1, older_than=0)
    release.set()
    background.drain()
    monkeypatch.undo()
    location = Supertable.open(uri).iceberg_metadata_location()
    assert rows_of(iceberg_scan(location).to_arrow().select(["_id", "key", "n"])) == \
        rows_of(Supertable.open(uri).to_arrow().select(["_id", "key", "n"]))


def test_a_tag_made_before_another_writer_won_the_metadata_is_still_named(tmp_path):
    from beam_supertable.format import tags as tag_records
    from beam_supertable.format.manifest import Manifest
    from beam_supertable.format.store import ObjectStore
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(5), 1))
    background.drain()                       # written without the tag...
    tag_records.create(ObjectStore(uri), "rel", 1, time.time())   # ...made only now
    manifest = Manifest(ObjectStore(uri))
    manifest.view(iceberg.IcebergMetadata).write(manifest.load(1))   # loses the create
    refs = json.load(open(f"{uri}/metadata/v1.metadata.json"))["refs"]
    assert refs["rel"] == {"snapshot-id": 1, "type": "tag"}
