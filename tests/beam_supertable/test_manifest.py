"""Versions, the OCC commit, idempotency, bad input and vacuum."""

import json
import os
import time

import pyarrow as pa
import pytest

from beam_supertable import (
    AlreadyExists, CommitConflictError, CommitFailedError, CommitRequest, CorruptManifestError,
    Manifest, NotATableError, ObjectStore, SchemaMismatchError, Supertable, SupertableError,
    TableExistsError, TokenReuseError, VersionNotFoundError)
from beam_supertable.manifest import HINT, PART_FANOUT, version_path
from tests.conftest import s3_options

SCHEMA = pa.schema([("x", pa.int64()), ("s", pa.string())])


def _entry(i, rows=1):
    return {"id": f"sf{i}", "path": f"data/sf{i}.parquet", "rows": rows}


@pytest.fixture
def table(table_location):
    uri, options = table_location
    return Supertable.create(uri, SCHEMA, storage_options=options)


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


def test_token_makes_a_retried_commit_land_once(table, table_location):
    uri, options = table_location
    m = Manifest(ObjectStore(uri, options))
    first = m.commit(CommitRequest(add_entries=(_entry(1),), token="job-1/window-0"))
    m.commit(CommitRequest(add_entries=(_entry(2),)))
    again = m.commit(CommitRequest(add_entries=(_entry(1),), token="job-1/window-0"))
    assert again.version == first.version == 1
    assert m.load().totals["superfiles"] == 2


def test_token_found_beyond_the_recent_window_with_base_version(table, table_location):
    uri, options = table_location
    m = Manifest(ObjectStore(uri, options))
    m.commit(CommitRequest(add_entries=(_entry(0),), token="old"))
    from beam_supertable import manifest as mf
    window, mf.RECENT_TOKENS = mf.RECENT_TOKENS, 3
    try:
        for i in range(6):
            m.commit(CommitRequest(add_entries=(_entry(i + 1),)))
        assert m.commit(CommitRequest(add_entries=(_entry(0),), token="old",
                                      base_version=0)).version == 1
    finally:
        mf.RECENT_TOKENS = window


def _old_token_out_of_window(m):
    """Commits token "old" (version 1), then six more tokened commits after it."""
    m.commit(CommitRequest(add_entries=(_entry(0),), token="old"))
    for i in range(6):
        m.commit(CommitRequest(add_entries=(_entry(i + 1),), token=f"stream/{i}"))
    return m


def test_a_token_past_the_recent_window_is_found_without_a_base_version(
        table, table_location, monkeypatch):
    """A rerun plans on a version after its token landed, so it has no
    ``base_version`` at or before it: the token is found however many tokened
    commits pushed it out of the recent window, and other rows under it are refused."""
    from beam_supertable import manifest as mf
    monkeypatch.setattr(mf, "RECENT_TOKENS", 3)
    uri, options = table_location
    m = _old_token_out_of_window(Manifest(ObjectStore(uri, options)))
    again = m.commit(CommitRequest(add_entries=(_entry(0),), token="old"))
    assert again.version == 1 and again.deduplicated
    with pytest.raises(TokenReuseError, match="old"):
        m.commit(CommitRequest(add_entries=(_entry(9, rows=5),), token="old"))
    assert m.load().version == 7 and m.load().totals["superfiles"] == 7


def test_a_token_that_lost_a_race_is_found_where_it_landed(table, table_location, monkeypatch):
    """The first attempt's version went to another writer; the token landed on
    the next one, and a rerun past the recent window finds it there."""
    from beam_supertable import manifest as mf
    monkeypatch.setattr(mf, "RECENT_TOKENS", 3)
    uri, options = table_location
    a, b = Manifest(ObjectStore(uri, options)), Manifest(ObjectStore(uri, options))
    stale = a.load()
    b.commit(CommitRequest(add_entries=(_entry(1),), token="other"))
    landed = a.commit(CommitRequest(add_entries=(_entry(2),), token="T"), base=stale)
    assert landed.version == 2 and not landed.deduplicated
    for i in range(6):
        b.commit(CommitRequest(add_entries=(_entry(i + 3),), token=f"stream/{i}"))
    again = b.commit(CommitRequest(add_entries=(_entry(2),), token="T"))
    assert again.version == 2 and again.deduplicated
    assert b.load().totals["superfiles"] == 8


def test_a_token_past_the_window_whose_version_was_vacuumed_is_refused(
        table, table_location, monkeypatch):
    """Whether a vacuumed version held the same rows cannot be told: refuse, never
    commit a second time."""
    from beam_supertable import manifest as mf
    monkeypatch.setattr(mf, "RECENT_TOKENS", 3)
    uri, options = table_location
    m = _old_token_out_of_window(Manifest(ObjectStore(uri, options)))
    m.vacuum(retain_versions=2, older_than=0)
    with pytest.raises(TokenReuseError, match="vacuumed"):
        m.commit(CommitRequest(add_entries=(_entry(0),), token="old"))
    assert m.load().version == 7


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


def test_vacuum_keeps_retained_and_young_objects(tmp_path):
    uri = str(tmp_path / "t")
    table = Supertable.create(uri, SCHEMA)
    for i in range(4):
        table.append(pa.table({"x": [i], "s": ["a"]}))
    orphan = tmp_path / "t" / "data" / "orphan.sf.parquet"
    orphan.write_bytes(b"x")
    foreign = tmp_path / "t" / "notes.txt"
    foreign.write_text("not ours")
    young = table.vacuum(retain_versions=1)  # default grace: everything is young
    assert young.removed_objects == ()
    old = time.time() - 3600
    for root, _, files in os.walk(tmp_path / "t"):
        for name in files:
            os.utime(os.path.join(root, name), (old, old))
    report = table.vacuum(retain_versions=2, older_than=60)
    assert report.removed_versions == (0, 1, 2)
    assert "data/orphan.sf.parquet" in report.removed_objects
    assert foreign.exists()
    latest = Supertable.open(uri)
    assert latest.count_rows() == 4 and latest.to_arrow().num_rows == 4
    assert Supertable.open(uri, version=3).to_arrow().num_rows == 3
    with pytest.raises(VersionNotFoundError):
        Supertable.open(uri, version=1)


def test_vacuum_older_than_none_is_the_default_grace_on_every_entry_point(tmp_path):
    # None used to mean "no grace" in Manifest.vacuum and "6 hours" in Supertable.vacuum.
    from beam_supertable import Manifest, Supertable
    t = Supertable.create(str(tmp_path / "t"), pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1]}))
    t.store.put("data/orphan.sf.parquet", b"not referenced by any version")
    for report in (t.vacuum(older_than=None), Manifest(t.store).vacuum(older_than=None)):
        assert "data/orphan.sf.parquet" not in report.removed_objects
    assert "data/orphan.sf.parquet" in t.vacuum(older_than=0, dry_run=True).removed_objects
    with pytest.raises(ValueError, match="older_than"):
        t.vacuum(older_than=-1)


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


def test_a_landed_token_is_honoured_only_for_the_same_rows(table, table_location, caplog):
    uri, options = table_location
    rows = pa.table({"x": list(range(10)), "s": [f"r{i}" for i in range(10)]})
    assert table.append(rows, token="load-1") == 1
    # A rerun rebuilds the same rows under new names and ids, split and
    # ordered differently: the same commit, so nothing new lands.
    rerun = Supertable.open(uri, storage_options=options)
    shuffled = rows.take(pa.array([9, 3, 1, 0, 2, 8, 7, 4, 6, 5]))
    with caplog.at_level("WARNING", logger="beam_supertable.manifest"):
        assert rerun.append(shuffled, token="load-1", n_shards=3) == 1
    assert "already landed at version 1" in caplog.text
    # The same token over other rows (one value differs) is refused, loudly.
    other = rows.set_column(1, "s", pa.array([f"r{i}" for i in range(9)] + ["changed"]))
    table.append(pa.table({"x": [99], "s": ["z"]}))  # the table moves on to version 2
    with pytest.raises(TokenReuseError) as err:
        Supertable.open(uri, storage_options=options).append(other, token="load-1")
    message = str(err.value)
    assert "'load-1'" in message and "version 1" in message and "version 2" in message
    assert (err.value.token, err.value.landed_version, err.value.base_version) == ("load-1", 1, 2)
    assert isinstance(err.value, SupertableError)
    latest = Supertable.open(uri, storage_options=options)
    assert latest.version == 2 and latest.count_rows() == 11
    assert rerun.snapshot.deduplicated and not latest.snapshot.deduplicated


def test_fingerprints_of_entries_without_row_digests_use_their_content(table, table_location):
    uri, options = table_location
    m = Manifest(ObjectStore(uri, options))
    stats = {"rows": 2, "stats": {"x": [1, 2]}}
    first = m.commit(CommitRequest(add_entries=({"id": "a", "path": "data/a", **stats},),
                                   token="t"))
    again = m.commit(CommitRequest(add_entries=({"id": "b", "path": "data/b", **stats},),
                                   token="t"))
    assert again.version == first.version == 1 and again.deduplicated and not first.deduplicated
    with pytest.raises(TokenReuseError, match="'t' already landed at version 1"):
        m.commit(CommitRequest(add_entries=({"id": "c", "path": "data/c", "rows": 2,
                                             "stats": {"x": [1, 3]}},), token="t"))
    assert m.load().version == 1


class _Injected(ObjectStore):
    """A real store whose creates of version documents fail as ``fail(path)`` says."""

    def __init__(self, uri, options, fail):
        super().__init__(uri, options)
        self.fail, self.calls = fail, 0

    def put_if_absent(self, path, data):
        if path.startswith("_supertable/versions/"):
            self.calls += 1
            self.fail(self, path, data)
        else:
            super().put_if_absent(path, data)


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
