"""Vacuum: which versions and objects it removes, its grace period and its options."""

import os
import time

import pyarrow as pa
import pytest

from beam_supertable import Supertable, TableExistsError, VersionNotFoundError
from tests.beam_supertable.conftest import SMALL_SCHEMA as SCHEMA


def _ints(a, b):
    return pa.table({"id": pa.array(range(a, b), pa.int64())})


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
    from beam_supertable import Supertable
    from beam_supertable.format.manifest import Manifest
    t = Supertable.create(str(tmp_path / "t"), pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1]}))
    t.store.put("data/orphan.sf.parquet", b"not referenced by any version")
    for report in (t.vacuum(older_than=None), Manifest(t.store).vacuum(older_than=None)):
        assert "data/orphan.sf.parquet" not in report.removed_objects
    assert "data/orphan.sf.parquet" in t.vacuum(older_than=0, dry_run=True).removed_objects
    with pytest.raises(ValueError, match="older_than"):
        t.vacuum(older_than=-1)


@pytest.mark.parametrize("bad", ["x", 2.5, None])
def test_vacuum_and_inspect_name_a_retain_versions_that_is_no_int(tmp_path, bad):
    """``retain_versions="x"`` raised "'<' not supported between 'str' and 'int'"."""
    from beam_supertable import inspect_table
    uri = str(tmp_path / "t")
    t = Supertable.create(uri, pa.schema([("id", pa.int64())]))
    t.append(_ints(0, 3))
    with pytest.raises(ValueError, match="retain_versions"):
        t.vacuum(retain_versions=bad)
    with pytest.raises(ValueError, match="retain_versions"):
        inspect_table(uri, retain_versions=bad)
    assert Supertable.open(uri).count_rows() == 3


def test_create_over_a_table_whose_first_versions_were_vacuumed(tmp_path):
    """Version 0 is gone, the table is not: ``create`` refuses and ``overwrite``
    commits on top of the latest version instead of starting again at 0."""
    uri = str(tmp_path / "t")
    table = Supertable.create(uri, SCHEMA)
    for i in range(3):
        table.append(pa.table({"x": [i], "s": ["a"]}))
    table.vacuum(retain_versions=1, older_than=0)
    with pytest.raises(TableExistsError):
        Supertable.create(uri, SCHEMA)
    assert Supertable.open(uri).version == 3 and Supertable.open(uri).count_rows() == 3
    assert Supertable.create(uri, SCHEMA, mode="exist_ok").version == 3
    emptied = Supertable.create(uri, SCHEMA, mode="overwrite")
    assert emptied.version == 4 and Supertable.open(uri).version == 4
    assert Supertable.open(uri).count_rows() == 0
