"""Every version reads the same through Iceberg readers: pyiceberg, and DuckDB and Polars.

A reference run of random upserts, deletes, appends, optimizes and vacuums is
checked version by version: pyiceberg's scan of snapshot N (opened from
version N's metadata file, and by snapshot id from the latest one) holds the
rows ``Supertable.open(uri, version=N).to_arrow()`` holds, ``_id`` s and
values alike.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable
from beam_supertable.errors import CorruptManifestError, IcebergDisabledError, SchemaMismatchError
from beam_supertable.iceberg import background, metadata as iceberg
from tests.beam_supertable.iceberg_reads import (
    assert_every_version_reads_alike, iceberg_scan, rows_of)

pyiceberg_table = pytest.importorskip("pyiceberg.table")
duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64()), ("label", pa.string()),
                    ("emb", pa.list_(pa.float32(), 4))])


def rows(keys, n, label="x"):
    keys = list(keys)
    rng = np.random.default_rng(len(keys) * 7919 + int(n))
    return pa.table({"key": [str(k) for k in keys], "n": [int(n)] * len(keys),
                     "label": [f"{label}{k}" for k in keys],
                     "emb": pa.array(list(rng.random((len(keys), 4), dtype=np.float32)),
                                     pa.list_(pa.float32(), 4))}, schema=SCHEMA)


def canonical(table: pa.Table) -> list:
    return rows_of(table.select(["_id", "key", "n", "label", "emb"]))


# -- the same rows at every version ----------------------------------------------------------------
def test_each_version_is_the_iceberg_snapshot_of_the_same_number(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, vector_column="emb", primary_key="key")
    t.upsert(rows(range(30), 1))
    t.upsert(rows(range(10, 20), 2))
    t.delete(pc.field("n") == 1)
    t.upsert(rows(range(5), 3))
    t.optimize()
    t.upsert(rows(range(3), 4))
    assert_every_version_reads_alike(uri)
    latest = pyiceberg_table.StaticTable.from_metadata(t.iceberg_metadata_location())
    operations = [s.summary.operation.value for s in latest.metadata.snapshots]
    assert operations == ["overwrite", "overwrite", "delete", "overwrite", "replace",
                          "overwrite"]
    assert latest.metadata.current_snapshot_id == t.version


@pytest.mark.s3
def test_a_table_on_the_s3_server_reads_alike_through_pyiceberg(s3_server, s3_bucket):
    from tests.conftest import s3_options
    uri, options = f"s3://{s3_bucket}/t", s3_options(s3_server)
    t = Supertable.create(uri, SCHEMA, primary_key="key", storage_options=options)
    t.upsert(rows(range(20), 1))
    t.upsert(rows(range(5), 2))
    t.delete(pc.field("key") == "7")
    assert t.iceberg_metadata_location().startswith(f"s3://{s3_bucket}/t/metadata/v3.")
    assert_every_version_reads_alike(uri, options)


OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.lists(st.integers(0, 40), min_size=1, max_size=25)),
    st.tuples(st.just("delete"), st.integers(0, 40), st.integers(0, 40)),
    st.tuples(st.just("optimize")),
    st.tuples(st.just("vacuum"), st.integers(1, 4)),
), min_size=1, max_size=8)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPERATIONS)
def test_random_histories_read_alike_at_every_retained_version(tmp_path_factory, operations):
    uri = str(tmp_path_factory.mktemp("t") / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for step, op in enumerate(operations):
        if op[0] == "upsert":
            t.upsert(rows(sorted(set(op[1])), step))
        elif op[0] == "delete":
            lo, hi = sorted(op[1:])
            t.delete((pc.field("key") >= str(lo)) & (pc.field("key") <= str(hi)))
        elif op[0] == "optimize":
            t.optimize()
        else:
            t.vacuum(retain_versions=op[1], older_than=0)
        t.refresh()
    assert_every_version_reads_alike(uri)


# -- other readers ---------------------------------------------------------------------------------
def test_polars_and_duckdb_read_the_live_rows_through_pyiceberg_and_the_dataset_face(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for n in range(5):
        t.upsert(rows(range(100), n))
    t.delete(pc.field("key") < "2")
    assert pl.DataFrame(iceberg_scan(t.iceberg_metadata_location()).to_arrow()).height == 100 - 12
    live = t.to_pyarrow_dataset()
    assert duckdb.sql("select count(*), sum(n) from live").fetchall()[0] == (88, 88 * 4)
    assert duckdb.sql("select count(distinct key) from live").fetchall()[0] == (88,)
    frame = pl.scan_pyarrow_dataset(live).filter(pl.col("key") == "50").select("label").collect()
    assert frame["label"].to_list() == ["x50"]
    assert canonical(live.to_table()) == canonical(t.to_arrow())
    # An outside Parquet reader on data/ sees every row ever written: the reason for the faces.
    assert duckdb.sql(f"select count(*) from '{uri}/data/*.parquet'").fetchall()[0][0] == 500


def test_the_dataset_face_pushes_projection_and_filter_down(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for n in range(4):
        t.upsert(rows(range(n * 10, n * 10 + 10), n))
    live = t.to_pyarrow_dataset()
    table = live.to_table(columns=["key"], filter=pc.field("n") == 2)
    assert table.schema.names == ["key"] and sorted(table["key"].to_pylist()) == \
        sorted(str(k) for k in range(20, 30))
    assert live.count_rows(filter=pc.field("n") >= 2) == 20
    assert live.head(3).num_rows == 3


def test_a_filter_prunes_data_files_in_pyiceberg_s_plan(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for n in range(6):
        t.upsert(rows(range(n * 10, n * 10 + 10), n * 100))
    scan = iceberg_scan(t.iceberg_metadata_location(), row_filter="n >= 400")
    assert len(list(scan.plan_files())) == 2
    assert len(list(iceberg_scan(t.iceberg_metadata_location()).plan_files())) == 6
    assert sorted(scan.to_arrow()["n"].to_pylist()) == [400] * 10 + [500] * 10


def test_deletes_are_position_delete_files_pyiceberg_applies(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(50), 1))
    t.delete(pc.field("key") == "3")
    tasks = list(iceberg_scan(t.iceberg_metadata_location()).plan_files())
    assert [len(task.delete_files) for task in tasks] == [1]
    [delete] = tasks[0].delete_files
    assert delete.file_path.endswith(".pos.parquet") and delete.record_count == 1


# -- the commit, crashes, repairs ------------------------------------------------------------------
def test_a_version_whose_metadata_was_not_written_stays_invisible_until_repaired(tmp_path,
                                                                               monkeypatch):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    background.drain()      # the failure below is version 2's alone
    monkeypatch.setattr(iceberg.IcebergMetadata, "write",
                        lambda self, snapshot: (_ for _ in ()).throw(OSError("disk gone")))
    t.upsert(rows(range(3), 2))
    background.drain()
    monkeypatch.undo()
    assert not os.path.exists(f"{uri}/metadata/v2.metadata.json")
    assert open(f"{uri}/metadata/version-hint.text").read() == "1"
    # Iceberg readers still see version 1 whole, never an empty or half table.
    hinted = f"{uri}/metadata/v1.metadata.json"
    assert canonical(iceberg_scan(hinted).to_arrow()) == \
        canonical(Supertable.open(uri, version=1).to_arrow())
    location = Supertable.open(uri).iceberg_metadata_location()
    assert location == f"{uri}/metadata/v2.metadata.json"
    assert open(f"{uri}/metadata/version-hint.text").read() == "2"
    assert_every_version_reads_alike(uri)


def test_a_torn_metadata_file_is_reported_not_read_as_empty(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    path = t.iceberg_metadata_location()     # written beside the commit: this waits for it
    assert path == f"{uri}/metadata/v1.metadata.json"
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CorruptManifestError, match="v1.metadata.json is not valid JSON"):
        Supertable.open(uri).iceberg_metadata_location()
    os.remove(path)
    assert Supertable.open(uri).iceberg_metadata_location() == path
    assert_every_version_reads_alike(uri)


def test_two_writers_of_one_version_s_metadata_write_the_same_bytes(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(10), 1))
    t.delete(pc.field("key") == "1")
    t.iceberg_metadata_location()
    before = {name: open(f"{uri}/metadata/{name}", "rb").read()
              for name in os.listdir(f"{uri}/metadata")}
    for name in before:
        if name != "version-hint.text":
            os.remove(f"{uri}/metadata/{name}")
    for version in range(t.version + 1):
        Supertable.open(uri).iceberg_metadata_location(version)
    after = {name: open(f"{uri}/metadata/{name}", "rb").read()
             for name in os.listdir(f"{uri}/metadata")}
    assert after == before


def test_vacuum_removes_the_metadata_of_removed_versions_and_keeps_what_is_read(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for n in range(6):
        t.upsert(rows(range(n, n + 10), n))
    t.optimize()
    report = t.vacuum(retain_versions=2, older_than=0)
    assert any(p.startswith("metadata/") for p in report.removed_objects)
    left = sorted(os.listdir(f"{uri}/metadata"))
    assert [n for n in left if n.endswith(".metadata.json")] == \
        [f"v{v}.metadata.json" for v in report.retained_versions]
    for version in report.retained_versions:
        location = t.iceberg_metadata_location(version)
        assert canonical(iceberg_scan(location).to_arrow()) == \
            canonical(Supertable.open(uri, version=version).to_arrow())


def test_metadata_written_per_commit_does_not_grow_with_the_table(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    sizes = []
    for n in range(40):
        names = set(os.listdir(f"{uri}/metadata")) if os.path.isdir(f"{uri}/metadata") else set()
        t.upsert(rows([n], n))
        t.iceberg_metadata_location()
        new = set(os.listdir(f"{uri}/metadata")) - names
        sizes.append(sum(os.path.getsize(f"{uri}/metadata/{m}") for m in new
                         if not m.endswith(".metadata.json")))
    # Manifests are per manifest part (merged in eights): a commit writes O(1) of them.
    assert max(sizes[20:]) <= 4 * max(sizes[:8])


# -- switched off, and turned on later -------------------------------------------------------------
def test_a_table_without_iceberg_metadata_says_how_to_turn_it_on(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key", iceberg=False)
    t.upsert(rows(range(10), 1))
    assert not os.path.exists(f"{uri}/metadata")
    with pytest.raises(IcebergDisabledError, match="sync_iceberg"):
        t.iceberg_metadata_location()
    location = t.sync_iceberg()
    assert location == f"{uri}/metadata/v2.metadata.json"
    assert t.sync_iceberg() == location           # idempotent: no second commit
    t.upsert(rows(range(3), 2))                    # later commits write their own
    background.drain()
    assert os.path.exists(f"{uri}/metadata/v3.metadata.json")
    assert canonical(iceberg_scan(location).to_arrow()) == \
        canonical(Supertable.open(uri, version=2).to_arrow())


def cli(*args):
    return subprocess.run([sys.executable, "-m", "beam_supertable", *args],
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=300)


def test_the_command_line_syncs_and_registers_in_a_sql_catalog(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key", iceberg=False)
    t.upsert(rows(range(10), 1))
    done = cli("iceberg", "sync", "--table", uri, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["metadata_location"] == f"{uri}/metadata/v2.metadata.json"
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    for _ in range(2):   # a rerun points the entry at the latest version again
        done = cli("iceberg", "register", "--table", uri, "--catalog", catalog, "--name", "ns.t")
        assert done.returncode == 0, done.stderr
    table = SqlCatalog("default", uri=catalog).load_table("ns.t")
    assert canonical(table.scan().to_arrow()) == canonical(Supertable.open(uri).to_arrow())
    bad = cli("iceberg", "register", "--table", uri, "--catalog", catalog, "--name", "t")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "--name t: expected NAMESPACE.TABLE" in bad.stderr


# -- a JVM engine ------------------------------------------------------------------------------
@pytest.mark.slow
def test_spark_reads_every_snapshot_as_the_version_holds_it(tmp_path):
    """Apache Spark with Iceberg's Spark runtime (from Maven Central), in its own process."""
    pytest.importorskip("pyspark")
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, vector_column="emb", primary_key="key")
    t.upsert(rows(range(40), 1))
    t.upsert(rows(range(10, 20), 2))
    t.delete(pc.field("key") < "2")
    t.optimize()
    t.upsert(rows(range(5), 3))
    t.iceberg_metadata_location()      # Spark opens the latest by name (the hint): wait for it
    done = subprocess.run([sys.executable, "-m", "tests.beam_supertable.spark_read", uri],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    spark = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {}
    for version in range(1, t.version + 1):
        held = Supertable.open(uri, version=version).to_arrow(columns=["key", "n"]).to_pydict()
        ours[str(version)] = [len(held["key"]), sum(held["n"]), sorted(held["key"])]
    assert spark == ours


# -- schemas, gaps, repairs, vacuum ------------------------------------------------------------
def test_an_overwrite_with_another_schema_leaves_the_old_snapshots_out_of_the_history(tmp_path):
    uri = str(tmp_path / "t")
    old = pa.schema([("a", pa.int64()), ("b", pa.string())])
    t = Supertable.create(uri, old)
    t.append(pa.table({"a": [1, 2], "b": ["x", "y"]}, schema=old))
    new = pa.schema([("b", pa.string()), ("a", pa.int64())])
    t = Supertable.create(uri, new, mode="overwrite")
    t.append(pa.table({"b": ["z"], "a": [3]}, schema=new))
    latest = pyiceberg_table.StaticTable.from_metadata(t.iceberg_metadata_location())
    assert [s.snapshot_id for s in latest.metadata.snapshots] == [2, 3]
    assert iceberg_scan(t.iceberg_metadata_location(1), row_filter="b == 'x'").to_arrow()[
        "a"].to_pylist() == [1]
    assert iceberg_scan(t.iceberg_metadata_location(),
                        row_filter="b == 'z'").to_arrow()["a"].to_pylist() == [3]


@pytest.mark.parametrize("column, why", [
    (pa.field("c", pa.uint32()), "no unsigned integers"),
    (pa.field("c", pa.uint64()), "no unsigned integers"),
    (pa.field("c", pa.time64("ns")), "time64"),
])
def test_a_column_without_an_iceberg_type_turns_the_face_off_and_says_which(tmp_path, column,
                                                                             why, caplog):
    schema = pa.schema([("k", pa.string()), column])
    with caplog.at_level("WARNING", logger="beam_supertable.iceberg.metadata"):
        t = Supertable.create(str(tmp_path / "t"), schema)
    assert re.search(f"column 'c'.*{why}.*without Iceberg metadata", caplog.text)
    assert not os.path.exists(tmp_path / "t" / "metadata")
    with pytest.raises(IcebergDisabledError, match="sync_iceberg"):
        t.iceberg_metadata_location()
    with pytest.raises(SchemaMismatchError, match="column 'c'.*iceberg=False"):
        t.sync_iceberg()
    assert t.version == 0


def test_nanosecond_timestamps_and_dictionaries_read_through_iceberg(tmp_path):
    schema = pa.schema([("k", pa.string()), ("t", pa.timestamp("ns")),
                        ("z", pa.timestamp("ns", "UTC")), ("d", pa.dictionary(pa.int32(),
                                                                               pa.string()))])
    t = Supertable.create(str(tmp_path / "t"), schema, primary_key="k")
    t.upsert(pa.table({"k": ["a", "b"],
                       "t": pa.array([1_600_000_000_123_456_000, 1_700_000_000_000_000_000],
                                     pa.timestamp("ns")),
                       "z": pa.array([1_000, 2_000], pa.timestamp("ns", "UTC")),
                       "d": pa.array(["x", "y"]).dictionary_encode()}, schema=schema))
    got = iceberg_scan(t.iceberg_metadata_location(),
                       row_filter="t > '2020-09-13T12:26:40'").to_arrow()
    assert got["k"].to_pylist() == ["a", "b"] and got["d"].to_pylist() == ["x", "y"]
    assert got["t"].cast(pa.int64()).to_pylist() == [1_600_000_000_123_456,
                                                     1_700_000_000_000_000]


def test_a_version_whose_metadata_failed_is_filled_in_by_the_next_commit(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for n in range(3):
        t.upsert(rows(range(n, n + 5), n))
    background.drain()
    real = iceberg.IcebergMetadata.write
    monkeypatch.setattr(iceberg.IcebergMetadata, "write",
                        lambda self, snapshot, **kw: (_ for _ in ()).throw(OSError("lost")))
    t.upsert(rows(range(3), 9))
    background.drain()
    monkeypatch.setattr(iceberg.IcebergMetadata, "write", real)
    assert not os.path.exists(f"{uri}/metadata/v4.metadata.json")
    t.upsert(rows(range(2), 10))
    t.iceberg_metadata_location()
    latest = pyiceberg_table.StaticTable.from_metadata(f"{uri}/metadata/v5.metadata.json")
    assert [s.snapshot_id for s in latest.metadata.snapshots] == [1, 2, 3, 4, 5]
    assert_every_version_reads_alike(uri)


def test_sync_writes_again_what_was_deleted_or_torn(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    t.upsert(rows(range(30), 1))
    t.upsert(rows(range(10), 2))
    t.delete(pc.field("key") == "20")
    t.iceberg_metadata_location()
    os.remove(f"{uri}/metadata/snap-3.avro")
    for name in os.listdir(f"{uri}/metadata"):
        if name.endswith("-data.avro"):
            os.remove(f"{uri}/metadata/{name}")
            break
    for name in os.listdir(f"{uri}/deletes"):
        if name.endswith(".pos.parquet"):
            with open(f"{uri}/deletes/{name}", "r+b") as f:
                f.truncate(10)
            os.remove(f"{uri}/deletes/{name}")
    with pytest.raises(Exception):
        iceberg_scan(t.iceberg_metadata_location()).to_arrow()
    assert t.sync_iceberg() == f"{uri}/metadata/v3.metadata.json"
    assert canonical(iceberg_scan(t.iceberg_metadata_location()).to_arrow()) == \
        canonical(t.to_arrow())
    assert t.version == 3                       # a repair commits nothing


def test_after_a_vacuum_the_latest_metadata_lists_only_kept_snapshots(tmp_path):
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, primary_key="key")
    for n in range(5):
        t.upsert(rows(range(n, n + 5), n))
    t.vacuum(retain_versions=2, older_than=0)
    latest = pyiceberg_table.StaticTable.from_metadata(t.iceberg_metadata_location())
    assert [s.snapshot_id for s in latest.metadata.snapshots] == [4, 5]
    t.upsert(rows(range(2), 7))
    latest = pyiceberg_table.StaticTable.from_metadata(t.iceberg_metadata_location())
    assert [s.snapshot_id for s in latest.metadata.snapshots] == [4, 5, 6]
    for snapshot in latest.metadata.snapshots:
        version = snapshot.snapshot_id
        scan = iceberg_scan(t.iceberg_metadata_location(), snapshot_id=version)
        assert canonical(scan.to_arrow()) == \
            canonical(Supertable.open(uri, version=version).to_arrow())


def test_polars_scans_the_iceberg_table_through_pyiceberg(tmp_path):
    """The guide's Polars snippet, vector column included."""
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, SCHEMA, vector_column="emb", primary_key="key")
    t.upsert(rows(range(20), 1))
    t.delete(pc.field("key") == "4")
    table = pyiceberg_table.StaticTable.from_metadata(t.iceberg_metadata_location())
    frame = pl.scan_iceberg(table, reader_override="pyiceberg").collect()
    assert frame.height == 19 and "4" not in frame["key"].to_list()
