"""Idempotency tokens: a retried commit lands once; the same token over other rows or
another filter is refused, past the window of recent tokens, after races, crashes and vacuum."""

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import Supertable, SupertableError, TokenReuseError
from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore
from tests.beam_supertable.conftest import small_entry as _entry


# -- the manifest's commit ---------------------------------------------------------
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
    from beam_supertable.format import manifest as mf
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
    from beam_supertable.format import manifest as mf
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
    from beam_supertable.format import manifest as mf
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


def test_a_token_whose_version_was_vacuumed_is_found_in_the_token_index(
        table, table_location, monkeypatch):
    """Vacuum folds the markers of the versions it removes into the token index:
    within the retention the same rows are deduplicated (the latest version is
    returned, nothing is committed) and other rows are refused."""
    from beam_supertable.format import manifest as mf
    monkeypatch.setattr(mf, "RECENT_TOKENS", 3)
    uri, options = table_location
    m = _old_token_out_of_window(Manifest(ObjectStore(uri, options)))
    report = m.vacuum(retain_versions=2, older_than=0)
    assert report.folded_tokens == 5   # versions 1..5 held tokens; 6 and 7 are kept
    again = m.commit(CommitRequest(add_entries=(_entry(0),), token="old"))
    assert again.deduplicated and again.version == 7
    with pytest.raises(TokenReuseError, match="already landed at version 1"):
        m.commit(CommitRequest(add_entries=(_entry(9, rows=5),), token="old"))
    assert m.load().version == 7


def test_a_landed_token_is_honoured_only_for_the_same_rows(table, table_location, caplog):
    uri, options = table_location
    rows = pa.table({"x": list(range(10)), "s": [f"r{i}" for i in range(10)]})
    assert table.append(rows, token="load-1") == 1
    # A rerun rebuilds the same rows under new names and ids, split and
    # ordered differently: the same commit, so nothing new lands.
    rerun = Supertable.open(uri, storage_options=options)
    shuffled = rows.take(pa.array([9, 3, 1, 0, 2, 8, 7, 4, 6, 5]))
    with caplog.at_level("WARNING", logger="beam_supertable.format.manifest"):
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


# -- append, upsert and delete of a table ------------------------------------------
def test_delete_token_reused_with_another_filter_is_refused(local_uri):
    """A token names one commit: a second delete under it with another filter must not
    silently return the old version while deleting nothing."""
    t = Supertable.create(local_uri, pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1, 2, 3]}))
    t.delete(pc.field("x") == 1, token="cleanup")
    try:
        t.delete(pc.field("x") == 2, token="cleanup")
    except TokenReuseError:
        return
    # Not refused: then the delete must have happened.
    assert sorted(t.refresh().to_arrow(columns=["x"])["x"].to_pylist()) == [3]


def test_token_reused_with_other_rows_after_the_window_is_refused(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": [0]}), token="tok-0")
    for i in range(1, 140):
        t.append(pa.table({"id": [i]}), token=f"tok-{i}")
    t = Supertable.open(uri)
    v = t.version
    assert t.append(pa.table({"id": [0]}), token="tok-0") == 1
    assert Supertable.open(uri).version == v
    with pytest.raises(TokenReuseError):
        Supertable.open(uri).append(pa.table({"id": [12345]}), token="tok-0")
    assert Supertable.open(uri).version == v
    assert Supertable.open(uri).count_rows() == 140


def test_upsert_token_reused_after_the_window_on_a_keyed_table(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("id", pa.int64()), ("x", pa.int64())]), primary_key="id")
    first = t.upsert(pa.table({"id": [1], "x": [1]}), token="u-0")
    for i in range(2, 140):
        t.upsert(pa.table({"id": [i], "x": [i]}), token=f"u-{i}")
    t = Supertable.open(uri)
    v = t.version
    # The same upsert again (a rerun): the landed version, nothing new.
    assert t.upsert(pa.table({"id": [1], "x": [1]}), token="u-0") == first
    with pytest.raises(TokenReuseError):
        t.upsert(pa.table({"id": [1], "x": [99]}), token="u-0")
    t = Supertable.open(uri)
    assert t.version == v
    assert t.count_rows(pc.field("id") == 1) == 1
    assert t.to_arrow(filter=pc.field("id") == 1)["x"].to_pylist() == [1]


def test_delete_token_reused_with_another_filter_after_the_window(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": list(range(10))}))
    t.delete(pc.field("id") == 0, token="del-0")
    for i in range(1, 140):
        t.append(pa.table({"id": [100 + i]}), token=f"a-{i}")
    t = Supertable.open(uri)
    v = t.version
    assert t.delete(pc.field("id") == 0, token="del-0") == 2
    with pytest.raises(TokenReuseError):
        t.delete(pc.field("id") == 5, token="del-0")
    t = Supertable.open(uri)
    assert t.version == v and t.count_rows(pc.field("id") == 5) == 1


@pytest.mark.slow
def test_a_token_that_landed_at_the_handles_own_version_is_found_past_the_window(local_uri):
    """``Supertable.append`` passes ``base_version=self.version``; after its own append
    with token T that version *is* T's. Once 128 other tokened commits push T out of
    ``recent_tokens``, ``_find_token`` scans ``range(base - 128, since, -1)``, which
    stops before ``since``: the retried append lands a second time."""
    t = Supertable.create(local_uri, pa.schema([("x", pa.int64())]))
    v = t.append(pa.table({"x": [1]}), token="T")
    other = Supertable.open(local_uri)
    for i in range(129):
        other.append(pa.table({"x": [100 + i]}), token=f"other-{i}")
    # t still stands on version v (T's own version): a retry of the same append.
    assert t.version == v
    again = t.append(pa.table({"x": [1]}), token="T")
    assert again == v
    assert Supertable.open(local_uri).count_rows(pc.field("x") == 1) == 1


# -- crashes and vacuum --------------------------------------------------------------
def _crash_marker(table, token, version):
    """What a tokened commit that died between its marker and its version leaves
    (the marker layout documented in beam_supertable.format.manifest)."""
    import hashlib
    import json
    path = (f"_supertable/tokens/{hashlib.sha256(token.encode()).hexdigest()}/"
            f"{version:020d}.json")
    table.store.put_if_absent(path, json.dumps({"token": token, "version": version},
                                               sort_keys=True).encode())


def test_retry_after_a_crash_whose_version_another_writer_took(table_location):
    uri, options = table_location
    t = Supertable.create(uri, pa.schema([("id", pa.int64())]), storage_options=options)
    _crash_marker(t, "crashed", 1)                      # died before creating version 1
    t.append(pa.table({"id": [1]}))                     # another writer takes version 1
    v = Supertable.open(uri, storage_options=options).append(pa.table({"id": [2]}),
                                                             token="crashed")
    assert v == 2 and Supertable.open(uri, storage_options=options).count_rows() == 2
    assert Supertable.open(uri, storage_options=options).append(
        pa.table({"id": [2]}), token="crashed") == 2


def test_retry_after_a_crash_whose_lost_version_was_vacuumed(table_location):
    """Vacuum drops a marker whose version holds another commit before it drops
    that version: the token never landed, so its retry commits (it was refused
    for good with TokenReuseError); a token that did land stays refused."""
    uri, options = table_location
    t = Supertable.create(uri, pa.schema([("id", pa.int64())]), storage_options=options)
    _crash_marker(t, "crashed", 1)
    for i in range(5):
        t.append(pa.table({"id": [i]}), token="landed" if i == 1 else None)  # v1: another's
    t.vacuum(retain_versions=1, older_than=0)
    t = Supertable.open(uri, storage_options=options)
    v = t.append(pa.table({"id": [99]}), token="crashed")
    assert t.count_rows() == 6 and v == 6
    with pytest.raises(TokenReuseError):   # landed (its version vacuumed where mtimes allow)
        t.append(pa.table({"id": [1234]}), token="landed")
    assert Supertable.open(uri, storage_options=options).count_rows() == 6


def test_token_reused_with_other_rows_after_vacuum_is_refused_not_skipped(local_uri):
    """The token is still in ``recent_tokens`` but vacuum removed the version that
    holds it: ``_find_token`` stops at the gap and returns ``base``, whose commit has
    no fingerprint for the token, so new rows are "deduplicated" and silently lost."""
    t = Supertable.create(local_uri, pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1]}), token="T")
    for i in range(15):
        t.append(pa.table({"x": [100 + i]}))
    t.vacuum(retain_versions=3, older_than=0)
    try:
        t.append(pa.table({"x": [2, 3]}), token="T")
    except TokenReuseError:
        return
    assert t.refresh().count_rows(pc.field("x") < 100) == 3
