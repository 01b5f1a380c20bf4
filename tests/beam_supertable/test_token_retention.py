"""Token retention: a rerun is deduplicated if it comes within ``token_retention`` of
the commit it repeats, and committed again after; vacuum removes what the horizon
passed and folds the markers of the versions it removes into the token index."""

import datetime

import pyarrow as pa
import pytest

from beam_supertable import Supertable, TokenReuseError
from beam_supertable.manifest import Manifest, TOKEN_INDEX, TOKENS, epoch_of

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


def _table(uri, retention=HOUR):
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
