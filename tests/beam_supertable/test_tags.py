"""Tags: names for versions that vacuum keeps, opened by name, shown to Iceberg readers."""

import json
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from beam_supertable import (
    Supertable, TagExistsError, TagNotFoundError, VersionNotFoundError, inspect_table)
from tests.beam_supertable.conftest import SMALL_SCHEMA as SCHEMA
from tests.beam_supertable.iceberg_reads import rows_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _table(path, appends=3):
    t = Supertable.create(str(path / "t"), SCHEMA)
    for i in range(appends):
        t.append(pa.table({"x": [i, 10 + i], "s": [f"a{i}", f"b{i}"]}))
    return t


def _rows(table):
    return rows_of(table.to_arrow())


def test_a_tagged_version_survives_vacuum_and_opens_by_name(tmp_path):
    t = _table(tmp_path)
    t.tags.create("before-cleanup", 2)
    tagged_rows = _rows(t.checkout(2))
    t.optimize()        # later versions reference other superfiles than version 2
    t.append(pa.table({"x": [99], "s": ["z"]}))
    report = t.vacuum(retain_versions=1, older_than=0)
    assert 2 in report.retained_versions and report.tags == {"before-cleanup": 2}
    assert 2 in report.held_versions and report.held_bytes > 0
    assert set(report.retained_versions) == {2, t.version}
    opened = Supertable.open(t.uri, version="before-cleanup")
    assert opened.version == 2 and _rows(opened) == tagged_rows
    assert _rows(t.checkout("before-cleanup")) == tagged_rows
    assert Supertable.open(t.uri, version=t.version).count_rows() == 7   # an int still works
    with pytest.raises(VersionNotFoundError):
        Supertable.open(t.uri, version=1)
    shown = inspect_table(t.uri, retain_versions=1, older_than=0)["tags"]
    assert shown["list"] == [{"name": "before-cleanup", "version": 2}]
    assert shown["held"]["versions"] == 1 and shown["held"]["bytes"] > 0

    t.restore("before-cleanup")     # restore takes a tag's name too
    assert _rows(Supertable.open(t.uri)) == tagged_rows


def test_deleting_a_tag_lets_the_next_vacuum_remove_what_only_it_held(tmp_path):
    t = _table(tmp_path)
    t.tags.create("old", 3)
    old_files = {e["path"] for e in t.checkout(3).superfiles()}
    t.optimize()
    assert not old_files & {e["path"] for e in t.superfiles()}
    kept = t.vacuum(retain_versions=1, older_than=0)
    assert not old_files & set(kept.removed_objects)
    assert all((tmp_path / "t" / p).exists() for p in old_files)
    t.tags.delete("old")
    assert t.tags.list() == {}
    report = t.vacuum(retain_versions=1, older_than=0)
    assert 3 in report.removed_versions and old_files <= set(report.removed_objects)
    assert not any((tmp_path / "t" / p).exists() for p in old_files)
    with pytest.raises(TagNotFoundError, match="no tag named 'old'; the table's tags: none"):
        Supertable.open(t.uri, version="old")


def test_tag_mistakes_are_refused_in_one_line_naming_the_tag_or_version(tmp_path):
    t = _table(tmp_path)
    t.tags.create("v1", 1)
    with pytest.raises(TagExistsError, match=r"tag 'v1' already exists \(on version 1\)"):
        t.tags.create("v1", 2)
    for bad in ("", "has space", "a/b", "-dash", "123", "x" * 129, None):
        with pytest.raises(ValueError, match="tag name must be") as info:
            t.tags.create(bad, 1)
        assert repr(bad) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(VersionNotFoundError, match=r"cannot tag 'future' on version 9: no such "
                                                   r"version \(the latest is 3\)"):
        t.tags.create("future", 9)
    t.optimize()
    t.vacuum(retain_versions=1, older_than=0)
    with pytest.raises(VersionNotFoundError, match="cannot tag 'gone' on version 2: .*vacuumed"):
        t.tags.create("gone", 2)
    with pytest.raises(ValueError, match="version must be an int"):
        t.tags.create("neg", -1)
    with pytest.raises(TagNotFoundError, match=r"no tag named 'nope'; the table's tags: v1 "
                                               r"\(version 1\)"):
        Supertable.open(t.uri, version="nope")
    with pytest.raises(TagNotFoundError):
        t.tags.delete("nope")
    assert t.tags.list() == {"v1": 1}
    assert t.tags.get_version("v1") == 1
    t.tags.update("v1", t.version)
    assert t.tags.list() == {"v1": t.version}


_RACER = """
import sys, time
from beam_supertable import Supertable, TagExistsError
uri, version, start, n = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
t = Supertable.open(uri)
time.sleep(max(0.0, start - time.time()))
for i in range(n):
    try:
        t.tags.create(f"race-{i}", version)
        print(f"race-{i}", flush=True)
    except TagExistsError:
        pass
"""


def test_two_processes_creating_one_tag_exactly_one_wins(tmp_path):
    t = _table(tmp_path)
    n = 25
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, t.uri, str(v), str(start), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for v in (1, 2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    won = [set(o[0].split()) for o in outs]
    assert not won[0] & won[1]
    assert won[0] | won[1] == {f"race-{i}" for i in range(n)}
    listed = t.tags.list()
    assert {name: v for v, names in zip((1, 2), won) for name in names} == listed


def test_iceberg_readers_see_tags_as_tag_refs(tmp_path):
    pyiceberg = pytest.importorskip("pyiceberg.table")
    t = _table(tmp_path)
    t.tags.create("first", 1)
    tagged_rows = _rows(t.checkout(1))
    # The latest metadata is rewritten with the tag at once.
    static = pyiceberg.StaticTable.from_metadata(t.iceberg_metadata_location())
    assert static.refs()["first"].snapshot_id == 1
    assert static.refs()["first"].snapshot_ref_type.value == "tag"
    assert rows_of(static.scan(snapshot_id=static.snapshot_by_name("first").snapshot_id)
                   .to_arrow()) == tagged_rows
    # Later versions carry it, also past vacuum.
    t.optimize()
    t.append(pa.table({"x": [7], "s": ["q"]}))
    t.vacuum(retain_versions=1, older_than=0)
    static = pyiceberg.StaticTable.from_metadata(t.iceberg_metadata_location())
    assert static.snapshot_by_name("first").snapshot_id == 1
    assert rows_of(static.scan(snapshot_id=1).to_arrow()) == tagged_rows
    assert rows_of(static.scan().to_arrow()) == _rows(t)
    # A deleted tag leaves the refs; sync puts back what a stale file lacks.
    t.tags.delete("first")
    doc = json.loads((tmp_path / "t" / "metadata" / f"v{t.version}.metadata.json").read_text())
    assert set(doc["refs"]) == {"main"}
    t.tags.create("again", t.version)
    path = tmp_path / "t" / "metadata" / f"v{t.version}.metadata.json"
    path.write_text(json.dumps(doc))            # as if a racing tag writer lost the refs
    t.sync_iceberg()
    doc = json.loads(path.read_text())
    assert doc["refs"]["again"] == {"snapshot-id": t.version, "type": "tag"}


def test_a_tag_created_while_vacuum_plans_is_seen_before_anything_is_deleted(tmp_path):
    t = _table(tmp_path)
    manifest = t.snapshot.manifest
    plan = manifest.plan_vacuum(retain_versions=1, older_than=0)
    assert 1 in plan.removed_versions and not manifest._needs_replan(plan)
    t.tags.create("late", 1)      # lands between the plan and the deletes
    assert manifest._needs_replan(plan)
    assert 1 in manifest.plan_vacuum(retain_versions=1, older_than=0).retained_versions
    t.vacuum(retain_versions=1, older_than=0)
    assert Supertable.open(t.uri, version="late").count_rows() == 2


def test_a_pipeline_reads_a_tag_and_the_iceberg_face_names_its_metadata(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from beam_supertable import ReadFromSupertable
    t = _table(tmp_path)
    t.tags.create("one", 1)
    t.append(pa.table({"x": [5], "s": ["later"]}))
    assert t.iceberg_metadata_location("one").endswith("/metadata/v1.metadata.json")
    with TestPipeline() as p:
        rows = (p | ReadFromSupertable(t.uri, version="one", columns=["x", "s"])
                | "plain" >> beam.Map(lambda r: (r["x"], r["s"])))
        assert_that(rows, equal_to([(0, "a0"), (10, "b0")]))


def test_tag_refs_take_an_old_tagged_snapshot_the_history_left_out():
    from beam_supertable.iceberg.refs import with_tags
    fields = [{"id": 1, "name": "x", "required": False, "type": "long"}]
    snap = {"snapshot-id": 3, "parent-snapshot-id": 2, "timestamp-ms": 3,
            "manifest-list": "m3", "summary": {"operation": "append"}, "schema-id": 0}
    own = {"schemas": [{"fields": fields}], "snapshots": [snap]}
    other = {"schemas": [{"fields": fields + [{"id": 2, "name": "y", "required": False,
                                                "type": "long"}]}],
             "snapshots": [dict(snap, **{"snapshot-id": 4})]}
    doc = {"current-snapshot-id": 200, "schemas": [{"fields": fields}],
           "snapshots": [{"snapshot-id": 150}, {"snapshot-id": 200}],
           "refs": {"main": {"snapshot-id": 200, "type": "branch"},
                    "stale": {"snapshot-id": 150, "type": "tag"}}}
    out = with_tags(doc, {"old": 3, "recent": 150, "renamed": 4, "future": 201, "main": 3},
                    {3: own, 4: other}.get)
    assert out["refs"] == {"main": {"snapshot-id": 200, "type": "branch"},
                           "old": {"snapshot-id": 3, "type": "tag"},
                           "recent": {"snapshot-id": 150, "type": "tag"}}
    assert [s["snapshot-id"] for s in out["snapshots"]] == [3, 150, 200]
    assert "parent-snapshot-id" not in out["snapshots"][0]
