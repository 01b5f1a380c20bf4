"""Supertable.create modes: create, exist_ok (settings must agree), overwrite."""

import pyarrow as pa
import pytest

from beam_supertable import SchemaMismatchError, Supertable, TableExistsError

SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string()),
                    ("emb", pa.list_(pa.float32(), 2))])


def _rows(n):
    return pa.table({"id": list(range(n)), "body": [f"w{i}" for i in range(n)],
                     "emb": [[float(i), 1.0] for i in range(n)]}, schema=SCHEMA)


def test_create_refuses_an_existing_table_by_default(table_location):
    uri, options = table_location
    Supertable.create(uri, SCHEMA, storage_options=options)
    with pytest.raises(TableExistsError):
        Supertable.create(uri, SCHEMA, storage_options=options)


def test_exist_ok_opens_the_same_table_and_refuses_other_settings(table_location):
    uri, options = table_location
    t = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                          storage_options=options)
    t.append(_rows(5))
    again = Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"],
                              storage_options=options, mode="exist_ok")
    assert again.version == t.version and again.count_rows() == 5
    with pytest.raises(SchemaMismatchError, match="vector"):
        Supertable.create(uri, SCHEMA, vector_column="emb", metric="cosine",
                          fts_columns=["body"], storage_options=options, mode="exist_ok")
    with pytest.raises(SchemaMismatchError, match="fts"):
        Supertable.create(uri, SCHEMA, vector_column="emb", storage_options=options,
                          mode="exist_ok")
    other = pa.schema([("id", pa.int64())])
    with pytest.raises(SchemaMismatchError, match="schema"):
        Supertable.create(uri, other, storage_options=options, mode="exist_ok")


def test_overwrite_starts_an_empty_version_and_keeps_history(table_location):
    uri, options = table_location
    t = Supertable.create(uri, SCHEMA, vector_column="emb", storage_options=options)
    v = t.append(_rows(7))
    other = pa.schema([("name", pa.string())])
    fresh = Supertable.create(uri, other, storage_options=options, mode="overwrite")
    assert fresh.version == v + 1
    assert fresh.count_rows() == 0 and fresh.to_arrow().num_rows == 0
    assert fresh.user_schema.equals(other) and "vector" not in fresh.properties
    fresh.append(pa.table({"name": ["a", "b"]}))
    assert Supertable.open(uri, storage_options=options).count_rows() == 2
    old = Supertable.open(uri, version=v, storage_options=options)
    assert old.count_rows() == 7 and old.to_arrow(columns=["id"]).num_rows == 7


def test_modes_and_metrics_are_validated(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        Supertable.create(str(tmp_path / "t"), SCHEMA, mode="replace")
    with pytest.raises(ValueError, match="metric"):
        Supertable.create(str(tmp_path / "u"), SCHEMA, vector_column="emb", metric="euclid")
    with pytest.raises(TypeError):
        Supertable.create(str(tmp_path / "v"), SCHEMA, "emb")  # options are keyword-only
