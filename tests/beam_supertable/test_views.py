"""Derived views: the commit loop keeps the Iceberg face in step without importing it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from beam_supertable import Supertable
from beam_supertable.format import views
from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore
from beam_supertable.iceberg import IcebergMetadata
from beam_supertable.iceberg.metadata import settle

SCHEMA = pa.schema([("k", pa.int64())])


def test_a_manifest_made_from_the_storage_layer_alone_keeps_the_iceberg_metadata():
    # Importing nothing above format/ still registers the face: the package's
    # __init__ loads it before any of its modules.
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json
        from beam_supertable.format.manifest import Manifest
        from beam_supertable.format.store import ObjectStore
        print(json.dumps([type(v).__name__ for v in Manifest(ObjectStore("memory://v")).views]))
    """)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["IcebergMetadata"]


def test_each_commit_of_a_bare_manifest_writes_the_iceberg_metadata(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA)
    manifest = Manifest(ObjectStore(uri))
    version = manifest.commit(CommitRequest(operation="set_properties",
                                            set_properties={"note": "x"})).version
    settle(manifest.store)     # written beside the commit, by this process
    assert (tmp_path / "t" / "metadata" / f"v{version}.metadata.json").exists()
    assert isinstance(manifest.view(IcebergMetadata), IcebergMetadata)


class _Failing:
    calls = 0

    def __init__(self, manifest):
        pass

    def after_commit(self, snapshot):
        type(self).calls += 1
        raise RuntimeError("view down")

    def needed_by(self, snapshot):
        return set()

    def owns(self, path):
        return False

    def after_vacuum(self, latest, retained):
        pass


@pytest.fixture
def failing_view():
    views.register_view(_Failing)
    try:
        yield _Failing
    finally:
        views._FACTORIES.remove(_Failing)


def test_a_view_that_fails_after_a_commit_is_logged_and_the_version_stands(
        tmp_path, failing_view, caplog):
    t = Supertable.create(str(tmp_path / "t"), SCHEMA)
    with caplog.at_level(logging.WARNING, logger="beam_supertable.format.manifest"):
        version = t.append(pa.table({"k": [1, 2]}))
    assert failing_view.calls >= 1
    assert Supertable.open(str(tmp_path / "t")).version == version == 1
    assert Supertable.open(str(tmp_path / "t")).count_rows() == 2
    assert any("version 1 landed, but _Failing failed after it" in r.getMessage()
               and "view down" in r.getMessage() for r in caplog.records)


def test_registering_a_view_twice_keeps_one(failing_view):
    views.register_view(_Failing)
    assert views._FACTORIES.count(_Failing) == 1


def test_asking_for_a_view_that_is_not_registered_says_so(tmp_path):
    manifest = Manifest(ObjectStore(str(tmp_path / "t")))
    with pytest.raises(LookupError, match="no _Failing view is registered"):
        manifest.view(_Failing)
