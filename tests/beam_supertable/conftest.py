"""Fixtures shared by the beam_supertable tests: a small table on every backend."""

import pyarrow as pa
import pytest

from beam_supertable import Supertable

SMALL_SCHEMA = pa.schema([("x", pa.int64()), ("s", pa.string())])


def small_entry(i, rows=1):
    """A superfile entry for a manifest commit (no object behind it)."""
    return {"id": f"sf{i}", "path": f"data/sf{i}.parquet", "rows": rows}


@pytest.fixture
def table(table_location):
    """A new empty table of ``SMALL_SCHEMA`` on each backend."""
    uri, options = table_location
    return Supertable.create(uri, SMALL_SCHEMA, storage_options=options)


@pytest.fixture
def local_uri(tmp_path):
    """Where a new table on local disk goes (nothing there yet)."""
    return str(tmp_path / "table")
