"""The manifest: versions, history, the optimistic commit and its retries, bad manifests."""

import json

import pyarrow as pa
import pytest

from beam_supertable import (
    AlreadyExists, CommitConflictError, CommitFailedError, CorruptManifestError, NotATableError,
    SchemaMismatchError, Supertable, TableExistsError, VersionNotFoundError)
from beam_supertable.format.documents import HINT, version_path
from beam_supertable.format.manifest import PART_FANOUT, CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore
from tests.beam_supertable.conftest import SMALL_SCHEMA as SCHEMA
from tests.beam_supertable.conftest import small_entry as _entry
from tests.conftest import s3_options


def test_append_open_history_and_snapshot_isolation(table, table_location):
    uri, options = table_location
    v1 = table.append(pa.table({"x": [1, 2], "s": ["a", "b"]}), metadata={"frontier": 10})
    v2 = table.append(pa.table({"x": [3], "s": ["c"]}))
    assert (v1, v2) == (1, 2)
    old = Supertable.open(uri, version=1, storage_options=options)
    table.append(pa.table({"x": [4], "s": ["d"]}))
    assert old.count_rows() == 2 and sorted(old.to_arrow()["x"].to_pylist()) == [1, 2]
    latest = Supertable.open(uri, storage_options=options)
    assert latest.version == 3 and latest.count_rows() == 4
    ids = latest.to_arrow()["_id"].to_pylist()
    assert len(set(ids)) == 4
    history = latest.history()
    assert [h["version"] for h in history] == [0, 1, 2, 3]
    assert history[1]["metadata"] == {"frontier": 10}
    assert history[1]["operation"] == "append" and history[0]["operation"] == "create"
    assert table.append(pa.table({"x": pa.array([], pa.int64())})) == 3  # empty: no commit


def test_create_twice_and_bad_paths(table, table_location, tmp_path):
    uri, options = table_location
    with pytest.raises(TableExistsError):
        Supertable.create(uri, SCHEMA, storage_options=options)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "f.txt").write_text("hi")
    with pytest.raises(NotATableError, match="not a supertable"):
        Supertable.open(str(tmp_path / "plain"))
    with pytest.raises(VersionNotFoundError, match="version 7 does not exist"):
        Supertable.open(uri, version=7, storage_options=options)


def test_corrupt_and_truncated_manifests_name_the_object(table, table_location):
    uri, options = table_location
    table.append(pa.table({"x": [1], "s": ["a"]}))
    store = ObjectStore(uri, options)
    good = store.get(version_path(1))
    store.put(version_path(1), good[: len(good) // 2])
    with pytest.raises(CorruptManifestError, match="00000000000000000001.json"):
        Supertable.open(uri, version=1, storage_options=options)
    store.put(version_path(1), good.replace(b'"rows":1', b'"rows":9'))
    with pytest.raises(CorruptManifestError, match="does not match"):
        Supertable.open(uri, version=1, storage_options=options)


def test_schema_change_needs_the_explicit_option(table):
    wider = pa.schema(list(table.schema) + [pa.field("y", pa.float64())])
    with pytest.raises(SchemaMismatchError, match="allow_schema_change"):
        table.commit(CommitRequest(operation="alter", schema=wider))
    assert table.commit(CommitRequest(operation="alter", schema=wider,
                                      allow_schema_change=True)) == 1
    with pytest.raises(SchemaMismatchError, match="'x' has type"):
        table.append(pa.table({"x": ["not an int"]}))


def test_lost_race_rebases_and_both_commits_land(table, table_location):
    uri, options = table_location
    first = Manifest(ObjectStore(uri, options))
    second = Manifest(ObjectStore(uri, options))
    base = second.load()
    first.commit(CommitRequest(add_entries=(_entry(1),)))
    landed = second.commit(CommitRequest(add_entries=(_entry(2),)), base=base)
    assert landed.version == 2
    assert sorted(e["id"] for e in landed.entries()) == ["sf1", "sf2"]


def test_metadata_stamps_rebase_and_real_conflicts_fail(table, table_location):
    uri, options = table_location
    a, b = Manifest(ObjectStore(uri, options)), Manifest(ObjectStore(uri, options))
    base = b.load()
    grid = {"path": "_supertable/grid/g1.npy", "n_cells": 4}
    a.commit(CommitRequest(operation="stamp", set_properties={"grid": grid}))
    # The same stamp on a stale base re-applies cleanly...
    assert b.commit(CommitRequest(set_properties={"grid": grid},
                                  add_entries=(_entry(1),)), base=base).version == 2
    # ...a different one is a real conflict, reported with both values.
    with pytest.raises(CommitConflictError, match="already"):
        b.commit(CommitRequest(set_properties={"grid": {**grid, "n_cells": 8}}))


def test_latest_is_found_from_a_stale_or_missing_hint(table, table_location):
    uri, options = table_location
    for i in range(3):
        table.append(pa.table({"x": [i], "s": ["a"]}))
    store = ObjectStore(uri, options)
    store.put(HINT, json.dumps({"version": 1}).encode())
    assert Manifest(store).latest_version() == 3
    store.delete(HINT)
    assert Manifest(store).latest_version() == 3


def test_commits_reuse_parts_and_merge_them_logarithmically(table, table_location):
    uri, options = table_location
    m = Manifest(ObjectStore(uri, options))
    for i in range(PART_FANOUT ** 2 + 3):
        snap = m.commit(CommitRequest(add_entries=(_entry(i),)))
    assert len(snap.parts) <= 2 * (PART_FANOUT - 1)
    assert sorted(e["id"] for e in snap.entries()) == sorted(
        f"sf{i}" for i in range(PART_FANOUT ** 2 + 3))
    before = {p.path for p in snap.parts}
    after = m.commit(CommitRequest(add_entries=(_entry("x"),)))
    assert before <= {p.path for p in after.parts}  # unchanged parts referenced, not rewritten


def test_commit_rebuilds_the_request_on_every_base(tmp_path):
    store = ObjectStore(str(tmp_path / "t"))
    manifest = Manifest(store)
    manifest.create(pa.schema([("x", pa.int64())]))
    stale = manifest.load()
    manifest.commit(CommitRequest(operation="other"))
    seen = []

    def rebuild(base):
        seen.append(base.version)
        return CommitRequest(operation="rebuilt", metadata={"on": base.version})

    landed = manifest.commit(CommitRequest(operation="x"), base=stale, rebuild=rebuild)
    assert seen == [0, 1]                   # lost the race on 0, rebuilt on 1
    assert landed.version == 2 and landed.commit["metadata"] == {"on": 1}
    assert landed.commit["operation"] == "rebuilt"
    assert manifest.commit(CommitRequest(), rebuild=lambda base: None).version == 2
    with pytest.raises(ValueError, match="must keep req.add_entries"):
        manifest.commit(CommitRequest(add_entries=({"id": "a", "path": "data/a", "rows": 1},)),
                        rebuild=lambda base: CommitRequest())

@pytest.mark.s3
def test_a_listing_cached_by_one_handle_never_hides_a_newer_version(s3_server, s3_bucket):
    uri, options = f"s3://{s3_bucket}/table", s3_options(s3_server)
    Manifest(ObjectStore(uri, options)).create(SCHEMA)
    lister, writer = Manifest(ObjectStore(uri, options)), Manifest(ObjectStore(uri, options))
    assert lister.store.fs is writer.store.fs  # fsspec hands both handles one s3fs instance
    base = writer.load()
    lister.history()  # lists versions/: s3fs caches that listing in the shared instance
    # Another process: its own S3 client and cache, so its writes invalidate nothing here.
    elsewhere = Manifest(ObjectStore(uri, {**options, "skip_instance_cache": True}))
    assert elsewhere.store.fs is not writer.store.fs
    elsewhere.commit(CommitRequest(add_entries=(_entry(1),)))
    assert lister.latest_version() == writer.latest_version() == 1
    # Racing from the stale base, the writer loses the create of version 1 and
    # must see the winner to rebase; a cached listing would hide it forever.
    writer._sleep = lambda s: None
    landed = writer.commit(CommitRequest(add_entries=(_entry(2),)), base=base, max_retries=3)
    assert landed.version == 2
    assert sorted(e["id"] for e in landed.entries()) == ["sf1", "sf2"]


class _Injected(ObjectStore):
    """A real store whose creates of version documents fail as ``fail(path)`` says."""

    def __init__(self, uri, options, fail):
        super().__init__(uri, options)
        self.fail, self.calls = fail, 0

    def put_if_absent(self, path, data, **how):
        if path.startswith("_supertable/versions/"):
            self.calls += 1
            self.fail(self, path, data)
        else:
            super().put_if_absent(path, data, **how)


def _manifest_with(uri, options, fail):
    m = Manifest(_Injected(uri, options, fail))
    sleeps = []
    m._sleep = sleeps.append
    return m, sleeps


def test_errors_retrying_cannot_fix_surface_at_once(table, table_location):
    uri, options = table_location

    def denied(store, path, data):
        raise PermissionError(f"access denied: {path}")

    m, sleeps = _manifest_with(uri, options, denied)
    with pytest.raises(PermissionError, match="versions/0+1.json") as err:
        m.commit(CommitRequest(add_entries=(_entry(1),)))
    assert sleeps == [] and m.store.calls == 1  # no retry
    assert uri in str(err.value) and "creating" in str(err.value)
    assert not isinstance(err.value, CommitConflictError)


def test_a_commit_that_never_lands_raises_commit_failed(table, table_location):
    uri, options = table_location

    def times_out(store, path, data):
        raise TimeoutError(f"injected: create of {path} timed out")

    m, sleeps = _manifest_with(uri, options, times_out)
    with pytest.raises(CommitFailedError, match="did not land after 3 attempts") as err:
        m.commit(CommitRequest(add_entries=(_entry(1),), token="t"), max_retries=2)
    assert isinstance(err.value, CommitConflictError)  # callers catching that keep working
    assert isinstance(err.value.__cause__, TimeoutError) and len(sleeps) == 2

    def loses(store, path, data):
        raise AlreadyExists(f"injected: {path} already exists")

    m, sleeps = _manifest_with(uri, options, loses)
    with pytest.raises(CommitFailedError, match="lost the race"):
        m.commit(CommitRequest(add_entries=(_entry(1),)), max_retries=1)
    assert Supertable.open(uri, storage_options=options).version == 0


def test_a_real_conflict_is_not_a_commit_failure(table, table_location):
    uri, options = table_location
    m = Manifest(ObjectStore(uri, options))
    m.commit(CommitRequest(set_properties={"grid": {"path": "g1"}}))
    with pytest.raises(CommitConflictError) as err:
        m.commit(CommitRequest(set_properties={"grid": {"path": "g2"}}))
    assert not isinstance(err.value, CommitFailedError)


def test_a_create_that_landed_but_failed_is_this_commit_not_a_duplicate(table, table_location):
    uri, options = table_location

    def lands_then_times_out(store, path, data):
        ObjectStore.put_if_absent(store, path, data)
        if store.calls == 1:
            raise TimeoutError(f"injected: the reply to the create of {path} was lost")

    m, sleeps = _manifest_with(uri, options, lands_then_times_out)
    landed = m.commit(CommitRequest(add_entries=(_entry(1),), token="t"))
    assert landed.version == 1 and not landed.deduplicated and len(sleeps) == 1
    again = m.commit(CommitRequest(add_entries=(_entry(1),), token="t"))
    assert again.version == 1 and again.deduplicated


@pytest.mark.s3
def test_a_table_whose_bucket_is_gone_fails_at_once(s3_server, s3_bucket):
    import boto3

    uri, options = f"s3://{s3_bucket}/table", s3_options(s3_server)
    m = Manifest(ObjectStore(uri, options))
    base = m.create(SCHEMA)
    s3 = boto3.resource("s3", endpoint_url=s3_server, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")
    s3.Bucket(s3_bucket).objects.all().delete()
    s3.Bucket(s3_bucket).delete()
    sleeps = []
    m._sleep = sleeps.append
    with pytest.raises(FileNotFoundError) as err:
        m.commit(CommitRequest(add_entries=(_entry(1),)), base=base)
    assert sleeps == [] and uri in str(err.value)
