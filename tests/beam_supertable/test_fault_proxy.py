"""Faults on the wire: a TCP proxy between the clients and the S3 server.

The proxy (``fault_proxy.py``, a process of its own) refuses, resets, cuts
short and stalls a seeded share of the HTTP requests. Clients reach the
server only through it, with timeouts of a second; a clean client that
bypasses it checks the truth on the server after every scenario:

* appends, deletes and Beam writes land exactly once or fail with a
  ``SupertableError`` naming the table (retried by the caller with the same
  token or ``job_id``, as a user would);
* reads retry, and return the right answer or a clear error, never a wrong one;
* nothing committed is lost: the version chain has no gaps, every manifest
  verifies against its hash, every object a version references exists;
* vacuum never deletes an object a retained version references.

Each scenario prints its figures (requests faulted by kind, commits landed,
duplicates, lost); ``-s`` shows them.

Also runnable as a writer process (several of them append concurrently)::

    python -m tests.beam_supertable.test_fault_proxy append URI OPTIONS_JSON WRITER N
"""

import json
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_supertable import StoreIOError, Supertable, SupertableError
from beam_supertable.format import deletes as dv
from beam_supertable.format import store as store_mod
from beam_supertable.format.documents import VERSIONS, version_of
from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore
from tests.conftest import S3_CREDENTIALS, s3_options

pytestmark = pytest.mark.s3

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT_TIMEOUT_S = 0.5       # connect and read timeout of the proxied client
STALL_S = 1.0                # a stalled answer is held this long: past the client's timeout
FAULT_SHARE = 0.2            # of requests, in the random-fault scenarios
# Drawn with these weights (a kind listed twice is drawn twice as often): a stall
# costs a client timeout, the others a few milliseconds.
RANDOM_KINDS = ["refuse", "reset", "truncate"] * 2 + ["stall"]
CALL_ATTEMPTS = 6            # a caller's retries of one append / delete / read on a clear error
ROWS_PER_APPEND = 3
READ_ROWS, READ_ROUNDS = 400, 2
APPEND_SCHEMA = pa.schema([("writer", pa.string()), ("seq", pa.int64()), ("row", pa.int64())])


def proxied(url: str, *, botocore_attempts: int = 1) -> dict:
    """Storage options that reach the server through the proxy at ``url``.

    botocore's own retries are off by default (its backoff waits up to
    seconds): what is tested is the store's retrying (and s3fs's).
    """
    return {**S3_CREDENTIALS,
            "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"},
            "config_kwargs": {"connect_timeout": CLIENT_TIMEOUT_S,
                              "read_timeout": CLIENT_TIMEOUT_S,
                              "retries": {"total_max_attempts": botocore_attempts,
                                          "mode": "standard"}}}


def _assert_clear(exc: BaseException, uri: str) -> None:
    """A failure through the proxy is ours, and names the table."""
    assert isinstance(exc, SupertableError), f"not a SupertableError: {type(exc).__mro__}: {exc}"
    assert uri in str(exc), f"the error does not name the table {uri}: {exc}"


def _retry(call, uri: str, errors: list, attempts: int = CALL_ATTEMPTS):
    """``call()``, retried on clear errors (collected in ``errors``); None when all failed."""
    for _ in range(attempts):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - checked right here
            _assert_clear(exc, uri)
            errors.append(f"{type(exc).__name__}: {exc}")
    return None


def _faults(proxy) -> dict:
    stats = proxy.stats()
    return {"requests": stats["requests"], "faulted": stats["faulted_total"],
            **{k: v for k, v in stats["faulted"].items() if v}}


def _figures(scenario: str, proxy, **figures) -> dict:
    out = {"scenario": scenario, **_faults(proxy), **figures}
    print(f"\nfault-proxy {scenario}: " + ", ".join(f"{k} {v}" for k, v in out.items()
                                                    if k != "scenario"))
    return out


def check_table(uri: str, options: dict, since: int = 0) -> list:
    """The truth on the server: every version whole and hash-checked, no gaps,
    every referenced object present, no token twice. Returns the snapshots.

    Versions before ``since`` are not checked (a vacuum is removing them).
    """
    store = ObjectStore(uri, options)
    manifest = Manifest(store)
    listed = sorted(v for v in (version_of(o.path) for o in store.list(VERSIONS))
                    if v is not None and v >= since)
    latest = manifest.latest_version()
    assert listed == list(range(listed[0], latest + 1)), f"gaps in the version chain: {listed}"
    present = {o.path for o in store.list("")}
    snapshots = []
    for v in listed:
        snap = manifest.load(v)  # raises CorruptManifestError on a bad hash
        entries = snap.entries()
        assert snap.totals["superfiles"] == len(entries), f"version {v}: totals disagree"
        assert snap.totals["rows"] == sum(e["rows"] for e in entries), f"version {v}: rows"
        if v:
            assert snap.commit["parent"] == v - 1
        missing = manifest.referenced(snap) - present
        assert not missing, f"version {v} references missing objects {sorted(missing)[:5]}"
        snapshots.append(snap)
    tokens = [s.commit["token"] for s in snapshots if s.commit.get("token")]
    duplicated = [t for t, n in Counter(tokens).items() if n > 1]
    assert not duplicated, f"tokens committed twice: {duplicated}"
    return snapshots


# -- appends ------------------------------------------------------------------

def _append_rows(writer: str, seq: int) -> pa.Table:
    return pa.table({"writer": [writer] * ROWS_PER_APPEND, "seq": [seq] * ROWS_PER_APPEND,
                     "row": list(range(ROWS_PER_APPEND))}, schema=APPEND_SCHEMA)


def append_through_faults(uri: str, options: dict, writer: str, n: int):
    """Appends ``n`` commits with tokens ``writer/seq``, each retried on a clear error.

    Yields one record per append: its token, the version it reported (None
    if every attempt failed) and the errors met.
    """
    table = None
    for seq in range(n):
        errors: list = []
        if table is None:
            table = _retry(lambda: Supertable.open(uri, storage_options=options), uri, errors)
        token = f"{writer}/{seq}"
        version = None if table is None else _retry(
            lambda: table.append(_append_rows(writer, seq), token=token,
                                 metadata={"writer": writer, "seq": seq}), uri, errors)
        yield {"token": token, "version": version, "errors": errors}


def _spawn_writer(uri: str, options: dict, writer: str, n: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.beam_supertable.test_fault_proxy", "append", uri,
         json.dumps(options), writer, str(n)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_concurrent_appends(uri: str, proxy, writers: int, appends: int, seed: int,
                           share: float = FAULT_SHARE) -> dict:
    """The append scenario: ``writers`` processes through the faulty proxy."""
    clean = s3_options(proxy.upstream)
    Supertable.create(uri, APPEND_SCHEMA, storage_options=clean)
    proxy.configure(seed=seed, share=share, kinds=RANDOM_KINDS, stall_s=STALL_S,
                    match=None, limit=None, reset_counters=True)
    procs = [_spawn_writer(uri, proxied(proxy.url), f"w{i}", appends) for i in range(writers)]
    records = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
        lines = out.splitlines()
        assert lines and lines[-1] == "DONE", out[-2000:] + err[-2000:]
        records += [json.loads(line) for line in lines[:-1]]
    proxy.configure(share=0.0)

    snapshots = check_table(uri, clean)
    committed = {s.commit["token"]: s.version for s in snapshots if s.commit.get("token")}
    landed = {r["token"]: r["version"] for r in records if r["version"] is not None}
    rows = Supertable.open(uri, storage_options=clean).to_arrow().to_pylist()
    per_token = Counter(f"{r['writer']}/{r['seq']}" for r in rows)
    # A call that returned success and is not in the table at the version it
    # reported, with all its rows, is lost; rows beyond one commit's are duplicates.
    lost = [t for t, v in landed.items()
            if committed.get(t) != v or per_token[t] < ROWS_PER_APPEND]
    duplicates = [t for t, n in per_token.items() if n > ROWS_PER_APPEND]
    figures = _figures(
        "appends", proxy, share=share, writers=writers, calls=len(records),
        commits_landed=len(committed), calls_failed=sum(r["version"] is None for r in records),
        caller_retries=sum(len(r["errors"]) for r in records), duplicates=len(duplicates),
        lost=len(lost))
    assert not lost, f"appends that returned success are lost: {lost}"
    assert not duplicates, f"appends that landed twice: {duplicates}"
    for token in committed:
        assert per_token[token] == ROWS_PER_APPEND, f"{token}: {per_token[token]} rows"
    assert set(per_token) == set(committed), "rows of a commit the manifest does not hold"
    return figures


def test_appends_land_exactly_once_through_faults(fault_proxy, s3_bucket):
    figures = run_concurrent_appends(f"s3://{s3_bucket}/appends", fault_proxy,
                                     writers=2, appends=3, seed=11)
    assert figures["faulted"] > 0, "the proxy faulted nothing: the test tested nothing"
    assert figures["commits_landed"] >= figures["calls"] - figures["calls_failed"]


@pytest.mark.slow
def test_many_appends_land_exactly_once_through_faults(fault_proxy, s3_bucket):
    figures = run_concurrent_appends(f"s3://{s3_bucket}/appends", fault_proxy,
                                     writers=6, appends=20, seed=12, share=0.3)
    assert figures["faulted"] >= 100


# -- ambiguous creates, one fault at a time --------------------------------------

VERSION_PUT = r"^PUT .*/_supertable/versions/"


def _fresh(uri: str, proxy, n_rows: int = 6) -> Supertable:
    table = Supertable.create(uri, APPEND_SCHEMA, storage_options=s3_options(proxy.upstream))
    table.append(pa.table({"writer": ["base"] * n_rows, "seq": list(range(n_rows)),
                           "row": [0] * n_rows}, schema=APPEND_SCHEMA))
    return table


@pytest.mark.parametrize("kind", ["reset", "truncate", "stall"])
def test_a_create_that_landed_before_its_answer_was_lost_is_ours(fault_proxy, s3_bucket, kind):
    """The version create lands, its answer is lost, the retry gets 412: the
    commit landed once (no token, so only the store can tell it was ours)."""
    uri = f"s3://{s3_bucket}/t"
    _fresh(uri, fault_proxy)
    table = Supertable.open(uri, storage_options=proxied(fault_proxy.url))
    fault_proxy.configure(share=1.0, kinds=[kind], stall_s=STALL_S, match=VERSION_PUT, limit=1)
    version = table.append(_append_rows("w", 0))
    assert fault_proxy.stats()["faulted"][kind] == 1
    clean = Supertable.open(uri, storage_options=s3_options(fault_proxy.upstream))
    assert version == clean.version == 2, "the append committed twice"
    assert clean.count_rows() == 6 + ROWS_PER_APPEND == clean.to_arrow().num_rows
    check_table(uri, s3_options(fault_proxy.upstream))


def test_a_superfile_create_whose_answer_was_lost_is_ours(fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/t"
    _fresh(uri, fault_proxy)
    table = Supertable.open(uri, storage_options=proxied(fault_proxy.url))
    fault_proxy.configure(share=1.0, kinds=["reset"], match=r"^PUT .*/data/", limit=1)
    assert table.append(_append_rows("w", 0)) == 2
    assert fault_proxy.stats()["faulted"]["reset"] == 1
    clean = Supertable.open(uri, storage_options=s3_options(fault_proxy.upstream))
    assert clean.to_arrow(columns=["writer"])["writer"].to_pylist().count("w") == ROWS_PER_APPEND


def test_a_delete_whose_answer_was_lost_lands_once_without_error(fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/t"
    _fresh(uri, fault_proxy)
    table = Supertable.open(uri, storage_options=proxied(fault_proxy.url))
    fault_proxy.configure(share=1.0, kinds=["reset"], match=VERSION_PUT, limit=1)
    assert table.delete(pc.field("seq") < 2) == 2
    clean = Supertable.open(uri, storage_options=s3_options(fault_proxy.upstream))
    assert sorted(clean.to_arrow()["seq"].to_pylist()) == [2, 3, 4, 5]
    assert clean.count_rows() == 4 and clean.snapshot.totals["deleted"] == 2


def test_a_create_that_never_got_through_fails_clearly_and_the_retry_lands(
        fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/t"
    _fresh(uri, fault_proxy)
    table = Supertable.open(uri, storage_options=proxied(fault_proxy.url))
    fault_proxy.configure(share=1.0, kinds=["refuse"], match=VERSION_PUT)
    with pytest.raises(SupertableError) as info:
        table.append(_append_rows("w", 0), token="only-once", max_retries=1)
    _assert_clear(info.value, uri)
    assert "in transit" in str(info.value.__cause__ or info.value)
    clean = Supertable.open(uri, storage_options=s3_options(fault_proxy.upstream))
    assert clean.version == 1, "nothing may land when no create got through"
    fault_proxy.configure(share=0.0)
    assert table.append(_append_rows("w", 0), token="only-once") == 2
    assert table.append(_append_rows("w", 0), token="only-once") == 2
    check_table(uri, s3_options(fault_proxy.upstream))


def test_an_ambiguous_tokenless_commit_is_not_committed_twice(fault_proxy, s3_bucket, monkeypatch):
    uri = f"s3://{s3_bucket}/t"
    _fresh(uri, fault_proxy)
    monkeypatch.setattr(store_mod, "REQUEST_ATTEMPTS", 2)  # keep the failing round short
    manifest = Manifest(ObjectStore(uri, proxied(fault_proxy.url)))
    base = manifest.load()
    # Every request on a version object is reset (the create lands first), until
    # the commit loop backs off: then the network heals.
    fault_proxy.configure(share=1.0, kinds=["reset"], match=r"/_supertable/versions/")
    manifest._sleep = lambda seconds: fault_proxy.configure(share=0.0)
    entry = {"id": "sf-ambiguous", "path": "data/ambiguous.sf.parquet", "rows": 1}
    manifest.commit(CommitRequest(add_entries=(entry,)), base=base)
    assert fault_proxy.stats()["faulted"]["reset"] >= 2
    clean = Manifest(ObjectStore(uri, s3_options(fault_proxy.upstream)))
    ids = [e["id"] for e in clean.load().entries()]
    assert ids.count("sf-ambiguous") == 1, f"committed {ids.count('sf-ambiguous')} times"
    assert clean.latest_version() == base.version + 1


# -- deletes --------------------------------------------------------------------

def test_deletes_land_exactly_once_through_faults(fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/deletes"
    clean_options = s3_options(fault_proxy.upstream)
    seed = Supertable.create(uri, APPEND_SCHEMA, storage_options=clean_options)
    for part in range(4):
        seed.append(pa.table({"writer": ["seed"] * 10,
                              "seq": list(range(part * 10, part * 10 + 10)),
                              "row": [part] * 10}, schema=APPEND_SCHEMA))
    doomed = [1, 2, 14, 27, 30, 39]
    fault_proxy.configure(seed=21, share=FAULT_SHARE, kinds=RANDOM_KINDS, stall_s=STALL_S,
                          reset_counters=True)
    errors: list = []
    table = _retry(lambda: Supertable.open(uri, storage_options=proxied(fault_proxy.url)),
                   uri, errors)
    done = []
    for i, seq in enumerate(doomed):
        token = f"delete/{seq}" if i % 2 else None  # half with a token, half without

        def delete():
            try:
                return table.delete(pc.field("seq") == seq, token=token)
            except SupertableError:
                # A user re-runs a failed mutation on a fresh view of the table.
                _retry(table.refresh, uri, errors)
                raise
        if _retry(delete, uri, errors) is not None:
            done.append(seq)
    fault_proxy.configure(share=0.0)

    snapshots = check_table(uri, clean_options)
    clean = Supertable.open(uri, storage_options=clean_options)
    live = sorted(clean.to_arrow()["seq"].to_pylist())
    gone = set(range(40)) - set(live)
    deletes = [s for s in snapshots if s.commit["operation"] == "delete"]
    twice = 0  # rows a deletion vector lists that an earlier one already did
    for sf, paths in clean.snapshot.deletes.items():
        rows = np.concatenate([dv.decode(clean.store.get(p), p) for p in paths])
        twice += len(rows) - len(np.unique(rows))
    # Lost: a delete that returned is undone, or rows gone that no delete named.
    lost = sorted((set(done) - gone) | (gone - set(doomed)))
    _figures("deletes", fault_proxy, share=FAULT_SHARE, calls=len(doomed), commits_landed=len(deletes),
             calls_failed=len(doomed) - len(done), caller_retries=len(errors),
             duplicates=twice + len(deletes) - len(gone), lost=len(lost))
    assert not lost, f"rows wrongly live or gone: {lost}"
    assert twice == 0, "a row deleted twice"
    assert len(deletes) == len(gone), "a delete landed twice (or a commit deleted nothing)"
    assert clean.count_rows() == len(live), "the totals count a deletion twice"


# -- reads ----------------------------------------------------------------------

def _read_table(uri: str, options: dict) -> Supertable:
    from tests.beam_supertable.test_transforms import SCHEMA, _elements
    table = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                              n_cells=8, storage_options=options)
    rows = _elements(READ_ROWS)
    half = READ_ROWS // 2
    for part in range(2):
        table.append(pa.Table.from_pylist(rows[part * half:(part + 1) * half], schema=SCHEMA),
                     n_shards=2)
    return table


def _answers(table: Supertable) -> dict:
    from tests.beam_supertable.test_transforms import _vectors
    x = _vectors(READ_ROWS)
    return {
        "rows": table.to_arrow(columns=["_id", "n", "body"]).sort_by("_id").to_pylist(),
        "vector": table.search(vector=x[17], k=5, nprobe=8,
                               columns=["n"]).select(["_id", "_distance"]).to_pylist(),
        "text": table.search(text="row 77", k=3,
                             columns=["n"]).select(["_id", "_score"]).to_pylist(),
        "count": table.count_rows(pc.field("n") < 100),
    }


def test_reads_retry_and_never_answer_wrong(fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/reads"
    expected = _answers(_read_table(uri, s3_options(fault_proxy.upstream)))
    fault_proxy.configure(seed=31, share=FAULT_SHARE, kinds=RANDOM_KINDS, stall_s=STALL_S,
                          reset_counters=True)
    errors: list = []
    right = wrong = 0
    for _ in range(READ_ROUNDS):
        # A fresh handle each round: every read goes over the wire again.
        got = _retry(
            lambda: _answers(Supertable.open(uri, storage_options=proxied(fault_proxy.url))),
            uri, errors, attempts=3)
        if got is not None:
            right += got == expected
            wrong += got != expected
    fault_proxy.configure(share=0.0)
    figures = _figures("reads", fault_proxy, share=FAULT_SHARE, rounds=READ_ROUNDS, right=right,
                       clear_errors=len(errors), wrong=wrong)
    assert wrong == 0, "a read through the faults answered wrong"
    assert right >= 1 and figures["faulted"] > 0


def test_short_ranged_reads_are_retried_never_returned(fault_proxy, s3_bucket):
    """A body cut short with a Content-Length to match: no HTTP client can notice,
    so the store compares the length with the object's size."""
    uri = f"s3://{s3_bucket}/reads"
    expected = _answers(_read_table(uri, s3_options(fault_proxy.upstream)))
    # At most 3 short answers: fewer than a read's attempts, so every read lands.
    fault_proxy.configure(seed=32, share=0.5, kinds=["shorten"], match=r"^GET .*/data/",
                          limit=store_mod.REQUEST_ATTEMPTS - 1, reset_counters=True)
    got = _answers(Supertable.open(uri, storage_options=proxied(fault_proxy.url)))
    assert fault_proxy.stats()["faulted"]["shorten"] > 0
    assert got == expected


def test_reads_fail_clearly_when_the_network_stays_down(fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/reads"
    _read_table(uri, s3_options(fault_proxy.upstream))
    table = Supertable.open(uri, storage_options=proxied(fault_proxy.url))
    fault_proxy.configure(share=1.0, kinds=["refuse"], match=r"^GET .*/data/")
    started = time.monotonic()
    with pytest.raises(StoreIOError, match=r"data/.*failed in transit") as info:
        table.to_arrow()
    assert isinstance(info.value, ConnectionError) and uri in str(info.value)
    assert time.monotonic() - started < 30


# -- Beam -----------------------------------------------------------------------

def run_beam_write(uri: str, proxy, n: int, seed: int, share: float = FAULT_SHARE,
                   job_id: str = "fault-job") -> dict:
    """``WriteToSupertable`` through the faults, rerun with the same job_id until it lands."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from beam_supertable import WriteToSupertable
    from tests.beam_supertable.test_transforms import SCHEMA, _elements

    clean = s3_options(proxy.upstream)
    Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                      storage_options=clean)
    proxy.configure(seed=seed, share=share, kinds=RANDOM_KINDS, stall_s=STALL_S,
                    reset_counters=True)
    errors, runs = [], 0
    for _ in range(CALL_ATTEMPTS):
        runs += 1
        try:
            p = TestPipeline()
            commits = p | beam.Create(_elements(n), reshuffle=False) | WriteToSupertable(
                uri, storage_options=proxied(proxy.url), job_id=job_id, n_shards=2)
            assert_that(commits | beam.Map(lambda c: c.rows), equal_to([n]))
            p.run().wait_until_finish()
            break
        except Exception as exc:  # noqa: BLE001 - Beam re-raises the DoFn's error
            cause = exc
            while not isinstance(cause, SupertableError) and cause.__cause__ is not None:
                cause = cause.__cause__
            assert isinstance(cause, SupertableError) or uri in str(exc), repr(exc)[:2000]
            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    else:
        pytest.fail(f"the write never landed in {runs} runs: {errors}")
    proxy.configure(share=0.0)
    snapshots = check_table(uri, clean)
    writes = [s for s in snapshots if s.commit["operation"] == "write"]
    got = Supertable.open(uri, storage_options=clean).to_arrow(columns=["n"])["n"].to_pylist()
    figures = _figures("beam", proxy, share=share, rows=n, runs=runs,
                       commits_landed=len(writes), duplicates=len(got) - len(set(got)),
                       lost=n - len(set(got)))
    assert len(writes) == 1 and writes[0].commit["token"].startswith(f"{job_id}/")
    assert sorted(got) == list(range(n)), "rows lost or written twice"
    return figures


def test_beam_write_lands_exactly_once_through_faults(fault_proxy, s3_bucket):
    figures = run_beam_write(f"s3://{s3_bucket}/beam", fault_proxy, n=300, seed=41)
    assert figures["faulted"] > 0


@pytest.mark.slow
def test_beam_write_at_a_high_fault_share_lands_exactly_once(fault_proxy, s3_bucket):
    figures = run_beam_write(f"s3://{s3_bucket}/beam", fault_proxy, n=2000, seed=42, share=0.6)
    assert figures["faulted"] >= 20


# -- vacuum ---------------------------------------------------------------------

def test_vacuum_through_faults_keeps_every_referenced_object(fault_proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/vacuum"
    clean_options = s3_options(fault_proxy.upstream)
    Supertable.create(uri, APPEND_SCHEMA, storage_options=clean_options)
    fault_proxy.configure(seed=51, share=FAULT_SHARE, kinds=RANDOM_KINDS, stall_s=STALL_S,
                          reset_counters=True)
    # History with orphans: appends and deletes through the faults.
    records = list(append_through_faults(uri, proxied(fault_proxy.url), "v", 5))
    errors: list = []
    table = _retry(lambda: Supertable.open(uri, storage_options=proxied(fault_proxy.url)),
                   uri, errors)
    _retry(lambda: table.refresh().delete(pc.field("seq") == 3, token="vacuum-delete"),
           uri, errors)
    fault_proxy.configure(share=0.0)
    before = Supertable.open(uri, storage_options=clean_options)
    orphans, _ = before.write_superfiles(_append_rows("orphan", 0))  # never committed
    expected = before.to_arrow().sort_by("_id").to_pylist()
    before.iceberg_metadata_location()   # written beside the commit (or now, after a fault)
    objects_before = {o.path for o in before.store.list("")}

    fault_proxy.configure(seed=52, share=FAULT_SHARE, reset_counters=True)
    for _ in range(CALL_ATTEMPTS):
        try:
            report = table.vacuum(retain_versions=3, older_than=0)
            break
        except Exception as exc:  # noqa: BLE001 - checked right here
            _assert_clear(exc, uri)
            errors.append(str(exc))
        # A vacuum cut short leaves the versions it retains whole.
        fault_proxy.configure(share=0.0)
        check_table(uri, clean_options, since=before.version - 2)
        fault_proxy.configure(share=FAULT_SHARE)
    else:
        pytest.fail(f"vacuum never finished: {errors}")
    fault_proxy.configure(share=0.0)
    after = Supertable.open(uri, storage_options=clean_options)
    objects_after = {o.path for o in after.store.list("")}
    manifest = Manifest(after.store)
    retained = [manifest.load(v) for v in report.retained_versions]
    missing = set().union(*(manifest.referenced(snap) for snap in retained)) - objects_after
    _figures("vacuum", fault_proxy, share=FAULT_SHARE, appends=len(records), removed=len(report.removed_objects),
             kept=len(objects_after), referenced_missing=len(missing))
    assert not missing, f"vacuum deleted referenced objects: {sorted(missing)[:5]}"
    snapshots = check_table(uri, clean_options)
    assert [s.version for s in snapshots] == list(range(before.version - 2, before.version + 1))
    assert after.to_arrow().sort_by("_id").to_pylist() == expected, "vacuum lost rows"
    assert orphans[0]["path"] in report.removed_objects, "the orphan superfile was kept"
    # Vacuum writes one thing: the token index its removed versions' markers fold into.
    created = objects_after - objects_before
    assert all(p.startswith("_supertable/tokens/index/") for p in created), created
    assert objects_after - created < objects_before


def test_a_vacuum_cut_short_leaves_every_listed_version_readable(fault_proxy, s3_bucket):
    from beam_supertable.format.manifest import PART_FANOUT
    uri = f"s3://{s3_bucket}/vacuum"
    clean_options = s3_options(fault_proxy.upstream)
    table = Supertable.create(uri, APPEND_SCHEMA, storage_options=clean_options)
    for seq in range(PART_FANOUT + 1):  # the eighth commit merges the parts before it
        table.append(_append_rows("v", seq))
    proxied_table = Supertable.open(uri, storage_options=proxied(fault_proxy.url))
    fault_proxy.configure(share=1.0, kinds=["refuse"], match=r"^DELETE .*/_supertable/versions/")
    with pytest.raises(StoreIOError):
        proxied_table.vacuum(retain_versions=1, older_than=0)
    fault_proxy.configure(share=0.0)
    for entry in Supertable.open(uri, storage_options=clean_options).history():
        old = Supertable.open(uri, version=entry["version"], storage_options=clean_options)
        assert old.to_arrow().num_rows == ROWS_PER_APPEND * entry["version"]


def main(argv):
    mode, uri, options = argv[0], argv[1], json.loads(argv[2])
    if mode == "append":
        for record in append_through_faults(uri, options, argv[3], int(argv[4])):
            print(json.dumps(record), flush=True)
        print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
