"""Token retention: a rerun is deduplicated if it comes within ``token_retention`` of
the commit it repeats, and committed again after; vacuum removes what the horizon
passed and folds the markers of the versions it removes into the token index."""

import datetime

import pyarrow as pa
import pytest

from beam_supertable import Supertable, TokenReuseError
from beam_supertable.format.documents import TOKEN_INDEX, TOKENS, epoch_of
from beam_supertable.format.manifest import Manifest
from beam_supertable.format.tokens import _INDEX_CACHE

HOUR = 3600.0


class Clock:
    """The time every manifest reads (commit timestamps, vacuum's horizon)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self, _manifest=None) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock(1_800_000_000.0)
    monkeypatch.setattr(Manifest, "clock", c)
    return c


def _rows(*xs):
    return pa.table({"x": pa.array(xs, pa.int64())})


def _table(uri, retention: float = HOUR):
    return Supertable.create(uri, pa.schema([("x", pa.int64())]), token_retention=retention)


def _token_objects(t):
    return [i.path for i in t.store.list(TOKENS)]


def test_create_sets_the_retention_and_every_version_records_its_horizon(local_uri, clock):
    t = _table(local_uri, datetime.timedelta(hours=2))
    assert t.token_retention == datetime.timedelta(hours=2)
    t.append(_rows(1), token="a")
    commit = t.snapshot.commit
    assert epoch_of(commit["timestamp"]) - epoch_of(commit["token_horizon"]) == 2 * HOUR
    assert t.token_horizon().timestamp() == clock.now - 2 * HOUR
    default = Supertable.create(local_uri + "-default", pa.schema([("x", pa.int64())]))
    assert default.token_retention == datetime.timedelta(days=7)


@pytest.mark.parametrize("bad", [0, -1, "7d", True, float("nan")])
def test_a_bad_retention_is_refused_naming_it(local_uri, bad):
    with pytest.raises(ValueError, match="token_retention must be a positive number"):
        _table(local_uri, bad)


@pytest.mark.parametrize("vacuum_between", [False, True])
def test_a_rerun_at_the_edge_of_the_retention(local_uri, clock, vacuum_between):
    """Exactly at the edge it is still deduplicated; one second later it is committed
    again as a new commit (the documented choice), whether or not a vacuum ran."""
    t = _table(local_uri)
    landed = t.append(_rows(1, 2), token="batch-7")
    for i in range(3):
        t.append(_rows(100 + i), token=f"other-{i}")
    clock.now += HOUR
    if vacuum_between:
        t.vacuum(retain_versions=1, older_than=0)
    rerun = Supertable.open(local_uri)
    assert rerun.append(_rows(1, 2), token="batch-7") in (landed, rerun.version)
    assert rerun.snapshot.deduplicated and Supertable.open(local_uri).count_rows() == 5
    with pytest.raises(TokenReuseError):
        rerun.append(_rows(9), token="batch-7")
    clock.now += 1
    if vacuum_between:
        t.vacuum(retain_versions=1, older_than=0)   # the index object outlives the entry
    again = Supertable.open(local_uri).append(_rows(1, 2), token="batch-7")
    t.refresh()
    assert again == t.version and not t.snapshot.deduplicated and t.count_rows() == 7


def test_vacuum_folds_markers_so_a_vacuumed_version_is_still_deduplicated(local_uri, clock):
    t = _table(local_uri)
    for i in range(20):
        t.append(_rows(i), token=f"slot-{i}")
        clock.now += 1
    report = t.vacuum(retain_versions=1, older_than=0)
    assert report.folded_tokens == 19
    objects = _token_objects(t)
    assert len([p for p in objects if p.startswith(TOKEN_INDEX)]) == 1
    assert len(objects) == 2   # the index and the latest version's marker
    again = Supertable.open(local_uri)
    assert again.append(_rows(3), token="slot-3") == again.version == 20
    assert again.snapshot.deduplicated and Supertable.open(local_uri).count_rows() == 20
    with pytest.raises(TokenReuseError, match="already landed at version 4"):
        again.append(_rows(3, 4), token="slot-3")


def test_a_second_vacuum_merges_the_index_of_a_period(local_uri, clock):
    t = _table(local_uri)
    for i in range(10):
        t.append(_rows(i), token=f"slot-{i}")
        if i == 4:
            t.vacuum(retain_versions=1, older_than=0)
    t.vacuum(retain_versions=1, older_than=0)
    index = [p for p in _token_objects(t) if p.startswith(TOKEN_INDEX)]
    assert len(index) == 1
    for i in range(10):
        assert Supertable.open(local_uri).append(_rows(i), token=f"slot-{i}") == 10


def test_vacuum_past_the_horizon_leaves_no_token_objects(local_uri, clock):
    t = _table(local_uri)
    for i in range(10):
        t.append(_rows(i), token=f"slot-{i}")
    t.vacuum(retain_versions=1, older_than=0)
    clock.now += 2 * HOUR
    t.vacuum(retain_versions=1, older_than=0)
    assert _token_objects(t) == []


def test_set_token_retention_commits_once_and_vacuum_takes_the_keyword(local_uri, clock):
    t = _table(local_uri)
    version = t.set_token_retention(datetime.timedelta(minutes=30))
    assert version == 1 and t.token_retention == datetime.timedelta(minutes=30)
    assert t.set_token_retention(1800) == 1   # unchanged: nothing committed
    t.append(_rows(1), token="a")
    clock.now += 45 * 60
    report = t.vacuum(retain_versions=1, older_than=0, token_retention=HOUR)
    assert t.refresh().token_retention == datetime.timedelta(hours=1)
    assert report.token_horizon is not None and _token_objects(t) != []
    assert Supertable.open(local_uri).append(_rows(1), token="a") == t.version


def test_a_dry_run_with_a_retention_commits_nothing(local_uri, clock):
    t = _table(local_uri)
    t.append(_rows(1), token="a")
    clock.now += 2 * HOUR
    report = t.vacuum(older_than=0, dry_run=True, token_retention=3 * HOUR)
    assert t.refresh().version == 1 and report.removed_objects == ()
    report = t.vacuum(older_than=0, dry_run=True)
    assert any(p.startswith(TOKENS) for p in report.removed_objects)


# -- a soak ---------------------------------------------------------------------------
# What one version leaves once maintenance ran: its document, its Iceberg objects (the
# metadata file, the manifest list, a data manifest, version-hint.text), one manifest
# part, the live superfile, its token marker, the latest-version hint, the id claim.
KEPT_AFTER_MAINTENANCE = 11
# Objects one tokened commit of one superfile adds: the version, its part, the
# superfile, the marker and three Iceberg objects (metadata, list, data manifest);
# and a merged manifest part (with its data manifest) every eighth commit.
PER_COMMIT = 7.25


@pytest.mark.slow
def test_a_soak_of_tokened_commits_with_maintenance_stays_bounded(local_uri, clock):
    """1,000 one-second commits, optimize and vacuum every 100, tokens remembered
    for 300 s: the object count stays under a bound that does not grow with the
    soak, every retained version reads right, a rerun inside the horizon is
    deduplicated and one past it is committed again."""
    from beam_supertable.format.tokens import INDEX_PERIODS
    from beam_supertable.table.inspection import inspect_table
    commits, every, retention = 1000, 100, 300
    t = _table(local_uri, retention)
    expected = {0: 0}
    after, before = [], []
    bound = KEPT_AFTER_MAINTENANCE + INDEX_PERIODS + 2
    for i in range(commits):
        clock.now += 1
        expected[t.append(_rows(i, -i), token=f"slot-{i}")] = 2 * (i + 1)
        if (i + 1) % every == 0 and i + 1 < commits:   # the last stretch stays retained
            before.append(len(t.store.list("")))
            t.optimize()
            t.vacuum(retain_versions=1, older_than=0)
            expected[t.version] = 2 * (i + 1)
            after.append(len(t.store.list("")))
    assert max(after) <= bound, after
    assert max(before) <= bound + PER_COMMIT * every, before
    tokens = inspect_table(local_uri)["tokens"]
    assert tokens["index_objects"] <= INDEX_PERIODS + 2 and tokens["markers"] <= every + 1
    retained = [h["version"] for h in t.history()]
    assert len(retained) == every + 1   # and the last round's optimize
    for v in retained:
        rows = t.checkout(v).to_arrow(columns=["x"]).column("x").to_pylist()
        assert len(rows) == expected[v] and sum(rows) == 0
    latest = t.refresh().version
    inside = commits - retention // 2
    rerun = Supertable.open(local_uri)
    assert rerun.append(_rows(inside, -inside), token=f"slot-{inside}") == latest
    assert rerun.snapshot.deduplicated
    past = Supertable.open(local_uri)
    assert past.append(_rows(0, 0), token="slot-0") == latest + 1
    assert not past.snapshot.deduplicated


def test_a_folded_token_is_remembered_to_its_horizon_whatever_the_retention(local_uri, clock):
    """A retention that is not a whole multiple of its index periods still keeps
    the folded token until exactly its horizon (periods end after their entries)."""
    retention = 600.7
    clock.now = 1_800_007_386.31   # its period ends, rounded down, before this moment
    t = _table(local_uri, retention)
    t.append(_rows(1), token="edge")
    at = epoch_of(t.snapshot.commit["timestamp"])
    clock.now += 1
    t.append(_rows(2), token="next")
    t.vacuum(retain_versions=1, older_than=0)
    clock.now = at + retention - 0.01
    rerun = Supertable.open(local_uri)
    rerun.append(_rows(1), token="edge")
    assert rerun.snapshot.deduplicated and Supertable.open(local_uri).count_rows() == 2


class _ListsThenVacuums:
    """The token index listed, then a vacuum merging it runs before it is read."""

    def __init__(self, store, vacuum) -> None:
        self._store, self._vacuum, self._armed = store, vacuum, True

    def __getattr__(self, name):
        return getattr(self._store, name)

    def list(self, prefix):
        listed = self._store.list(prefix)
        if self._armed and prefix == TOKEN_INDEX:
            self._armed = False
            self._vacuum()
        return listed


def test_a_lookup_racing_a_vacuum_that_merges_the_index_still_finds_the_token(
        local_uri, clock):
    t = _table(local_uri)
    for i in range(3):
        t.append(_rows(i), token=f"slot-{i}")
        clock.now += 1
    t.vacuum(retain_versions=1, older_than=0)   # slot-0 and slot-1 folded
    t.append(_rows(3), token="slot-3")
    clock.now += 1
    _INDEX_CACHE.clear()   # a reader in another process has read no index object yet
    reader = Supertable.open(local_uri)
    manifest = reader._manifest
    manifest.store = _ListsThenVacuums(
        manifest.store, lambda: Supertable.open(local_uri).vacuum(retain_versions=1,
                                                                  older_than=0))
    assert manifest._indexed("slot-0", manifest.token_horizon(reader.snapshot)) is not None


def test_a_shorter_retention_forgets_at_once_without_a_vacuum(local_uri, clock):
    t = _table(local_uri)
    t.append(_rows(1), token="early")
    clock.now += HOUR / 2
    t.set_token_retention(HOUR / 4)
    rerun = Supertable.open(local_uri)
    rerun.append(_rows(1), token="early")
    assert not rerun.snapshot.deduplicated and Supertable.open(local_uri).count_rows() == 2
