"""Every store a pipeline writes to: atomic creates, the probe, refusals by what the
store answered, a missing client library, and a table that moves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from beam_supertable import Supertable, UnsafeBackendError
from beam_supertable.errors import AlreadyExists
from beam_supertable.format import store as store_mod
from beam_supertable.format.backends import refusal
from beam_supertable.format.store import ObjectStore
from beam_supertable.iceberg import background
from tests.beam_supertable.iceberg_reads import iceberg_scan, rows_of
from tests.conftest import backend_location, s3_options

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])


@pytest.fixture
def fresh_probes(monkeypatch):
    """Forget which endpoints this process probed (the cache is per process)."""
    monkeypatch.setattr(store_mod, "_PROBED", {})


def test_a_second_create_is_refused_on_every_backend(store_location, fresh_probes):
    uri, options = store_location
    first, second = ObjectStore(uri, options), ObjectStore(uri, options)
    first.put_if_absent("k.json", b"first")
    with pytest.raises(AlreadyExists, match="k.json"):
        second.put_if_absent("k.json", b"second")
    if "://" in uri:
        # A remote create whose answer was lost meets its own object: the same bytes
        # are success (a local create is never answered without landing).
        second.put_if_absent("k.json", b"first")
    assert second.get("k.json") == b"first"
    assert not [o.path for o in first.list("_supertable/probe")], "the probe cleans up"


def test_gcs_and_azure_tables_take_writers_without_single_writer(remote_location):
    uri, options = remote_location
    table = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    assert not table.store.single_writer
    table.upsert(pa.table({"id": [1, 2], "label": ["a", "b"]}))
    table.upsert(pa.table({"id": [2], "label": ["B"]}))
    reopened = Supertable.open(uri, storage_options=options)
    assert sorted(reopened.to_arrow(columns=["id", "label"]).to_pylist(),
                  key=lambda r: r["id"]) == [{"id": 1, "label": "a"}, {"id": 2, "label": "B"}]


def test_a_store_that_ignores_conditional_creates_is_refused_before_any_commit(
        s3_server, s3_bucket, fault_proxy, fresh_probes):
    fault_proxy.configure(drop_headers=["If-None-Match"])
    uri = f"s3://{s3_bucket}/dropping"
    options = s3_options(fault_proxy.url)
    with pytest.raises(UnsafeBackendError) as caught:
        Supertable.create(uri, SCHEMA, storage_options=options)
    message = str(caught.value)
    assert "\n" not in message and "accepted a second create" in message
    assert "single_writer=True" in message and uri in message
    direct = ObjectStore(uri, s3_options(s3_server))
    assert direct.list("") == [], "nothing was left behind, no version was written"
    # A user who knows there is one writer may still write through it.
    table = Supertable.create(uri, SCHEMA, storage_options=options, single_writer=True)
    assert table.append(pa.table({"id": [1], "label": ["x"]})) == 1


def test_the_probe_costs_one_request_pair_per_process_and_endpoint(
        s3_bucket, fault_proxy, fresh_probes):
    options = s3_options(fault_proxy.url)
    store = ObjectStore(f"s3://{s3_bucket}/p", options)
    fault_proxy.configure(reset_counters=True)
    store.put_if_absent("a", b"1")
    first = fault_proxy.stats()["requests"]
    fault_proxy.configure(reset_counters=True)
    ObjectStore(f"s3://{s3_bucket}/other-table", options).put_if_absent("b", b"2")
    again = fault_proxy.stats()["requests"]
    assert again == 1, "the probe ran again for an endpoint this process probed"
    assert first == again + 3, "two creates and a delete"


def test_a_conditional_write_in_conflict_is_retried(s3_bucket, fault_proxy, fresh_probes):
    store = ObjectStore(f"s3://{s3_bucket}/c", s3_options(fault_proxy.url))
    store.put_if_absent("warm", b"0")       # the probe, before any conflict
    fault_proxy.configure(kinds=["conflict"], share=1.0, limit=2, match="^PUT ",
                          reset_counters=True)
    store.put_if_absent("k", b"mine")
    stats = fault_proxy.stats()
    assert stats["faulted"]["conflict"] == 2
    assert store.get("k") == b"mine"


def test_seaweedfs_refuses_a_second_create_in_its_own_words(seaweedfs_server, request,
                                                           tmp_path, fresh_probes):
    import s3fs

    uri, options = backend_location(request, "seaweedfs", tmp_path)
    fs = s3fs.S3FileSystem(**options)
    root = uri[len("s3://"):]
    fs.pipe_file(f"{root}/k", b"1", mode="create")
    with pytest.raises(OSError) as caught:
        fs.pipe_file(f"{root}/k", b"2", mode="create")
    # s3fs does not make this a FileExistsError; what the server answered does.
    assert not isinstance(caught.value, FileExistsError)
    assert refusal(caught.value) == "exists"
    with pytest.raises(AlreadyExists):
        ObjectStore(uri, options).put_if_absent("k", b"2")


@pytest.mark.parametrize("scheme, library, extra", [
    ("gs", "gcsfs", "gcs"), ("az", "adlfs", "azure"), ("abfss", "adlfs", "azure")])
def test_a_missing_client_library_is_named_with_its_extra(scheme, library, extra):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.modules[{library!r}] = None        # as if it were not installed
        sys.modules[{library!r} + ".core"] = None
        from beam_supertable import Supertable
        import pyarrow as pa
        try:
            Supertable.create("{scheme}://bucket/t", pa.schema([("a", pa.int64())]))
        except ImportError as exc:
            print(exc)
    """)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line == (f"{scheme}://bucket/t: the {scheme}:// backend needs {library}; install "
                    f"it with pip install 'beam-upsert-supertable[{extra}]'")


@pytest.mark.parametrize("exc, answer", [
    (FileExistsError("x"), "exists"),
    (OSError(22, "At least one of the pre-conditions you specified did not hold"), None),
    (ValueError("no"), None),
])
def test_refusal_reads_the_answer_not_the_class(exc, answer):
    assert refusal(exc) == answer


def test_refusal_follows_the_cause_to_the_status():
    from botocore.exceptions import ClientError

    def boto(code, status):
        return ClientError({"Error": {"Code": code, "Message": "m"},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    for cause, answer in ((boto("PreconditionFailed", 412), "exists"),
                          (boto("ConditionalRequestConflict", 409), "conflict"),
                          (boto("SlowDown", 503), None)):
        wrapped = OSError(22, "translated")
        wrapped.__cause__ = cause
        assert refusal(wrapped) == answer


# -- a table that moves -----------------------------------------------------------
def _copy(src_uri, src_options, dst_uri, dst_options):
    """Every object of a table, copied as a backup or a move between buckets would:
    once its writers are done (the Iceberg metadata is written beside each commit)."""
    background.drain()
    src, dst = ObjectStore(src_uri, src_options), ObjectStore(dst_uri, dst_options)
    for info in src.list(""):
        dst.put(info.path, src.get(info.path))


def _iceberg_rows(table):
    return rows_of(iceberg_scan(table.iceberg_metadata_location(),
                                table.store.storage_options or None).to_arrow())


def test_a_copied_table_gives_iceberg_readers_its_own_rows(store_location, request, tmp_path):
    uri, options = store_location
    table = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    table.upsert(pa.table({"id": list(range(36)), "label": ["v1"] * 36}))
    table.delete(pa.compute.field("id") == 0)
    backend = request.node.callspec.params["store_location"]
    copy_uri, copy_options = backend_location(request, backend, tmp_path, name="copy")
    _copy(uri, options, copy_uri, copy_options)
    copy = Supertable.open(copy_uri, storage_options=copy_options)
    copy.upsert(pa.table({"id": [1], "label": ["changed"]}))
    copy.delete(pa.compute.field("id") == 2)
    ours = rows_of(copy.to_arrow())
    assert len(ours) == 34
    assert _iceberg_rows(copy) == ours
    # The original is untouched, through both faces.
    original = Supertable.open(uri, storage_options=options)
    assert _iceberg_rows(original) == rows_of(original.to_arrow())
    assert len(rows_of(original.to_arrow())) == 35


def test_sync_on_a_fresh_copy_writes_metadata_for_the_new_location(store_location, request,
                                                                   tmp_path):
    uri, options = store_location
    table = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    table.upsert(pa.table({"id": [1, 2, 3], "label": ["a", "b", "c"]}))
    table.delete(pa.compute.field("id") == 3)
    backend = request.node.callspec.params["store_location"]
    copy_uri, copy_options = backend_location(request, backend, tmp_path, name="copy")
    _copy(uri, options, copy_uri, copy_options)
    copy = Supertable.open(copy_uri, storage_options=copy_options)
    with pytest.raises(Exception, match="copied or moved here.*iceberg sync"):
        copy.iceberg_metadata_location()
    location = copy.sync_iceberg()
    meta = json.loads(ObjectStore(copy_uri, copy_options).get(
        location[len(location.rsplit("/metadata/", 1)[0]) + 1:]))
    assert meta["location"].rstrip("/").endswith(copy_uri.split("://", 1)[-1].rstrip("/"))
    assert _iceberg_rows(copy) == rows_of(copy.to_arrow())
    # Earlier versions are written for the new location on demand.
    first = copy.iceberg_metadata_location(1)
    assert rows_of(iceberg_scan(first, copy_options).to_arrow()) == rows_of(
        copy.checkout(1).to_arrow())



def test_every_backend_reports_when_an_object_was_written(store_location, fresh_probes):
    # Vacuum's grace is measured from these times: a store whose times went unread
    # would never have an orphan removed.
    uri, options = store_location
    store = ObjectStore(uri, options)
    store.put_if_absent("a", b"1")
    store.put("b", b"2")
    assert store.head("a").mtime is not None
    assert all(info.mtime is not None for info in store.list(""))


def test_a_cold_search_on_every_backend_finds_what_it_finds_on_local_disk(
        remote_location, tmp_path):
    # A remote store's cold reads go out together (codes of near runs in one read, row
    # groups in parallel); the answer is the one the sequential local reads give.
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4000, 16)).astype(np.float32)
    words = ["river", "stone", "cloud", "ember", "frost", "alpha"]
    data = pa.table({"n": np.arange(len(x)),
                     "body": [" ".join(rng.choice(words, 4)) for _ in range(len(x))],
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 16)})
    results = []
    for uri, options in (remote_location, (str(tmp_path / "local"), None)):
        table = Supertable.create(uri, data.schema, vector_column="emb", fts_columns=["body"],
                                  n_cells=32, storage_options=options)
        table.append(data)
        cold = Supertable.open(uri, storage_options=options)
        found = cold.search(vector=x[:5], k=10, columns=["n"], nprobe=8)
        text = Supertable.open(uri, storage_options=options).search(text="ember frost", k=10,
                                                                    columns=["n"])
        results.append((found.column("n").to_pylist(), found.column("_query").to_pylist(),
                        text.column("n").to_pylist()))
    assert results[0] == results[1]


def test_refusal_reads_an_azure_conflict_by_its_code():
    class AzureAnswer(Exception):
        def __init__(self, code):
            super().__init__(code)
            self.status_code, self.error_code = 409, code

    for code, answer in (("BlobAlreadyExists", "exists"), ("LeaseAlreadyPresent", None),
                         ("ContainerBeingDeleted", None)):
        translated = FileExistsError("k")      # adlfs makes every 409 this
        translated.__context__ = AzureAnswer(code)
        assert refusal(translated) == answer, code


def test_the_probe_is_kept_per_address_not_per_account_name():
    def azure(endpoint):
        return ObjectStore("az://container/t", {
            "account_name": "acct", "connection_string":
            f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5;"
            f"BlobEndpoint={endpoint}/acct;"})

    direct, gateway = azure("http://127.0.0.1:1"), azure("http://127.0.0.1:2")
    assert direct.endpoint() != gateway.endpoint()


def test_vacuum_keeping_a_version_leaves_iceberg_readers_only_what_it_kept(tmp_path):
    uri = str(tmp_path / "kept")
    table = Supertable.create(uri, SCHEMA)
    for i in range(8):
        table.append(pa.table({"id": [i], "label": ["x"]}))
    table.vacuum(older_than=0, retain_versions=1, keep_versions=[2])
    static = pytest.importorskip("pyiceberg.table").StaticTable
    latest = static.from_metadata(Supertable.open(uri).iceberg_metadata_location())
    assert [s.snapshot_id for s in latest.metadata.snapshots] == [2, 8]


def test_writing_an_earlier_version_on_demand_never_moves_the_hint_back(tmp_path):
    uri = str(tmp_path / "hinted")
    table = Supertable.create(uri, SCHEMA)
    for i in range(3):
        table.append(pa.table({"id": [i], "label": ["x"]}))
    table.iceberg_metadata_location()
    store = ObjectStore(uri)
    store.delete("metadata/v1.metadata.json")
    table.iceberg_metadata_location(1)
    assert store.get("metadata/version-hint.text").decode().strip() == "3"
