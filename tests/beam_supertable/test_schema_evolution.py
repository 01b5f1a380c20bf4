"""Schema changes by field id: add, drop, rename and widen columns, read by us and pyiceberg."""

import os
import subprocess
import sys

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import (
    DuplicateKeyError, SchemaMismatchError, Supertable, UpsertToSupertable, VersionNotFoundError,
    WriteToSupertable)
from beam_supertable.format import fields
from beam_supertable.iceberg.schema import iceberg_schema
from beam_upsert import UpsertCommand

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _iceberg_rows(table, version):
    static = pytest.importorskip("pyiceberg.table").StaticTable
    read = static.from_metadata(table.iceberg_metadata_location(version)).scan().to_arrow()
    return _rows(read)


def _rows(arrow):
    """Rows as sorted tuples of (column, value) without ``_id``."""
    out = []
    for row in arrow.to_pylist():
        row.pop("_id", None)
        out.append(tuple(sorted(row.items())))
    return sorted(out, key=repr)


def _keyed(tmp_path, **kwargs):
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int32()),
                        ("s", pa.string())])
    return Supertable.create(str(tmp_path / "t"), schema, primary_key="k", **kwargs)


# -- field ids -----------------------------------------------------------------
def test_ids_are_the_ones_the_iceberg_face_published(tmp_path):
    plain = pa.schema([("_id", pa.int64()), ("k", pa.int64()),
                       ("emb", pa.list_(pa.float32(), 2)), ("m", pa.map_(pa.string(), pa.int32())),
                       ("st", pa.struct([("x", pa.int32()), ("y", pa.list_(pa.string()))]))])
    with_ids = fields.with_ids(plain)
    # The same Iceberg schema, ids included, as before ids were recorded.
    assert iceberg_schema(with_ids).json == iceberg_schema(plain).json
    t = Supertable.create(str(tmp_path / "t"), pa.schema(list(plain)[1:]),
                          vector_column="emb")
    assert [fields.field_id(f) for f in t.schema] == [1, 2, 3, 5, 8]
    t.append(pa.table({"k": [1], "emb": [[1.0, 0.0]],
                       "m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int32())),
                       "st": [{"x": 1, "y": ["q"]}]}))
    written = pq.ParquetFile(os.path.join(t.uri, t.superfiles()[0]["path"]))
    assert [fields.field_id(f) for f in written.schema_arrow] == [1, 2, 3, 5, 8]
    assert written.schema_arrow.field("emb").type.value_field.metadata[fields.FIELD_ID] == b"4"
    # A schema bringing ids of its own (read from another Parquet file) gets the table's.
    foreign = pa.schema([pa.field("a", pa.int64(), metadata={fields.FIELD_ID: b"1"}),
                         pa.field("b", pa.int64(), metadata={fields.FIELD_ID: b"1"})])
    other = Supertable.create(str(tmp_path / "o"), foreign)
    assert [fields.field_id(f) for f in other.schema] == [1, 2, 3]


def test_a_table_written_before_ids_were_recorded(tmp_path, monkeypatch):
    import json
    from beam_supertable.format import documents, writer
    with monkeypatch.context() as m:   # as the code before ids wrote it
        m.setattr(documents, "with_ids", lambda schema: schema)
        m.setattr(fields, "with_ids", lambda schema: schema)
        m.setattr(writer, "FIELD_ID", b"unused")
        t = _keyed(tmp_path)
        t.upsert([{"k": 1, "v": 1, "s": "a"}, {"k": 2, "v": 2, "s": None}])
        assert fields.field_id(t.schema.field("v")) is None
        old = t.version
        published = json.loads(open(os.path.join(t.uri, t.iceberg_metadata_location(old)
                                                  .split(t.uri + "/", 1)[-1])).read())
    t = Supertable.open(t.uri)
    assert [fields.field_id(f) for f in t.schema] == [1, 2, 3, 4]
    assert [(f["name"], f["id"]) for f in published["schemas"][0]["fields"]] == \
        [("_id", 1), ("k", 2), ("v", 3), ("s", 4)]
    t.rename_column("v", "w")
    t.add_columns(pa.field("v", pa.int32()))
    t.upsert([{"k": 3, "w": 3, "v": 30, "s": "c"}])
    ours = t.to_arrow().drop_columns(["_id"]).sort_by("k")
    assert ours.to_pylist() == [{"k": 1, "w": 1, "s": "a", "v": None},
                                {"k": 2, "w": 2, "s": None, "v": None},
                                {"k": 3, "w": 3, "s": "c", "v": 30}]
    # The old superfile's statistics of "v" are those of w now.
    assert t.count_rows(pc.field("v").is_null()) == 2
    assert t.count_rows(pc.field("w") == 1) == 1
    assert _iceberg_rows(t, t.version) == _rows(ours)
    assert _iceberg_rows(t, old) == _rows(t.checkout(old).to_arrow())


# -- the verbs -------------------------------------------------------------------
def test_each_change_is_one_metadata_only_commit(tmp_path):
    t = _keyed(tmp_path)
    t.upsert([{"k": 1, "v": 5, "s": "x"}])
    files = {e["path"] for e in t.superfiles()}
    v = t.version
    assert t.add_columns(pa.field("u", pa.string())) == v + 1
    assert t.rename_column("v", "w") == v + 2
    assert t.alter_column("w", pa.int64()) == v + 3
    assert t.drop_columns("s") == v + 4
    assert {e["path"] for e in t.superfiles()} == files      # no data rewritten
    assert t.to_arrow().drop_columns(["_id"]).to_pylist() == [{"k": 1, "w": 5, "u": None}]
    assert t.schema.field("w").type == pa.int64()
    # Every earlier version still reads with its own schema.
    assert t.checkout(v).to_arrow().drop_columns(["_id"]).to_pylist() == \
        [{"k": 1, "v": 5, "s": "x"}]
    assert [h["operation"] for h in t.history()[-4:]] == \
        ["add_columns", "rename_column", "alter_column", "drop_columns"]


@pytest.mark.parametrize("call, words", [
    (lambda t: t.alter_column("v", pa.int8()), "'v'"),
    (lambda t: t.alter_column("s", pa.int64()), "'s'"),
    (lambda t: t.drop_columns("k"), "primary-key"),
    (lambda t: t.rename_column("emb", "e"), "vector"),
    (lambda t: t.drop_columns("body"), "text index"),
    (lambda t: t.drop_columns(["v", "nope"]), "'nope'"),
    (lambda t: t.rename_column("v", "s"), "'s'"),
    (lambda t: t.add_columns(pa.field("v", pa.string())), "'v'"),
    (lambda t: t.add_columns(pa.field("n", pa.string(), nullable=False)), "nullable"),
    (lambda t: t.add_columns(pa.field("u8", pa.uint32())), "u8"),
])
def test_bad_changes_are_refused_in_one_line_and_commit_nothing(tmp_path, call, words):
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int32()),
                        ("s", pa.string()), ("body", pa.string()),
                        ("emb", pa.list_(pa.float32(), 2))])
    t = Supertable.create(str(tmp_path / "t"), schema, primary_key="k", vector_column="emb",
                          fts_columns=["body"])
    before = t.version
    with pytest.raises(SchemaMismatchError) as err:
        call(t)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert t.refresh().version == before


def test_widenings(tmp_path):
    schema = pa.schema([("i", pa.int8()), ("f", pa.float32()), ("d", pa.decimal128(5, 2)),
                        ("s", pa.string())])
    t = Supertable.create(str(tmp_path / "t"), schema)
    t.append([{"i": 7, "f": 1.5, "d": "123.45", "s": "x"}])
    for name, kind in (("i", pa.int16()), ("i", pa.int64()), ("f", pa.float64()),
                       ("d", pa.decimal128(9, 2)), ("s", pa.large_string())):
        t.alter_column(name, kind)
    got = t.to_arrow().drop_columns(["_id"])
    assert got.schema.types == [pa.int64(), pa.float64(), pa.decimal128(9, 2), pa.large_string()]
    assert got.to_pylist()[0]["i"] == 7 and got.to_pylist()[0]["s"] == "x"
    assert _iceberg_rows(t, t.version) == _rows(got)


def test_drop_then_add_again_is_a_new_column_for_us_and_pyiceberg(tmp_path):
    t = _keyed(tmp_path)
    t.upsert([{"k": 1, "v": 1, "s": "old"}, {"k": 2, "v": 2, "s": "older"}])
    t.drop_columns("s")
    t.add_columns(pa.field("s", pa.string()))
    t.upsert([{"k": 3, "v": 3, "s": "new"}])
    want = [{"k": 1, "v": 1, "s": None}, {"k": 2, "v": 2, "s": None},
            {"k": 3, "v": 3, "s": "new"}]
    ours = t.to_arrow().drop_columns(["_id"]).sort_by("k")
    assert ours.to_pylist() == want
    assert _iceberg_rows(t, t.version) == _rows(ours)
    # The latest Iceberg metadata keeps every schema: time travel reads each
    # snapshot with its own.
    static = pytest.importorskip("pyiceberg.table").StaticTable
    latest = static.from_metadata(t.iceberg_metadata_location())
    assert [len(s.fields) for s in latest.metadata.schemas] == [4, 3, 4]
    assert latest.metadata.last_column_id == 5
    first = latest.scan(snapshot_id=1).to_arrow()
    assert _rows(first) == [(("k", 1), ("s", "old"), ("v", 1)), (("k", 2), ("s", "older"), ("v", 2))]
    # Iceberg bounds and null counts of the old superfile are not the new column's.
    old_entry = [e for e in t.superfiles() if e["rows"] == 2][0]
    ids = iceberg_schema(t.schema, t.properties).columns_of(old_entry)
    assert "s" not in ids and ids["v"] == (3, "int")
    assert latest.scan(row_filter="s is null").to_arrow().num_rows == 2
    # Filters see the new column too (statistics of the old one do not prune).
    assert t.count_rows(pc.field("s").is_null()) == 2
    assert t.to_arrow(filter=pc.field("s") == "old").num_rows == 0
    # optimize rewrites without the dropped data; every read stays the same.
    t.optimize()
    assert t.to_arrow().drop_columns(["_id"]).sort_by("k").to_pylist() == want
    for entry in t.superfiles():
        kept = pq.read_schema(os.path.join(t.uri, entry["path"]))
        assert [fields.field_id(f) for f in kept] == [fields.field_id(f) for f in t.schema]
    assert _iceberg_rows(t, t.version) == _rows(ours)


def test_search_lookups_and_datasets_see_the_current_schema(tmp_path):
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("n", pa.int32()),
                        ("body", pa.string()), ("emb", pa.list_(pa.float32(), 2))])
    t = Supertable.create(str(tmp_path / "t"), schema, primary_key="k", vector_column="emb",
                          fts_columns=["body"])
    t.upsert([{"k": i, "n": i, "body": f"word{i}", "emb": [float(i), 1.0]} for i in range(4)])
    t.rename_column("n", "m")
    t.alter_column("m", pa.int64())
    t.add_columns(pa.field("tag", pa.string()))
    hit = t.search(vector=[2.0, 1.0], k=1, nprobe=10)
    assert (hit["k"].to_pylist(), hit["m"].to_pylist(), hit["tag"].to_pylist()) == \
        ([2], [2], [None])
    assert hit.schema.field("m").type == pa.int64()
    assert t.search(text="word3", k=1)["m"].to_pylist() == [3]
    assert t.to_pyarrow_dataset().to_table(columns=["k", "m", "tag"]).sort_by("k")["m"] \
        .to_pylist() == [0, 1, 2, 3]
    # An upsert reads the existing rows by key through the same schema.
    t.upsert([{"k": 1, "m": 10, "body": "word1", "emb": [1.0, 1.0], "tag": "t"}])
    assert t.to_arrow(filter=pc.field("m") >= 3).sort_by("k")["k"].to_pylist() == [1, 3]


def test_changes_read_across_schema_changes(tmp_path):
    t = _keyed(tmp_path)
    start = t.upsert([{"k": 1, "v": 1, "s": "a"}])
    t.rename_column("v", "w")
    t.add_columns(pa.field("u", pa.string()))
    t.upsert([{"k": 1, "w": 10, "s": "b", "u": "x"}])
    t.drop_columns("s")
    got = t.changes(start - 1)
    assert got.column_names == ["_id", "k", "w", "u", "_change", "_version",
                                "_commit_timestamp"]
    rows = sorted((r["_version"], r["_change"], r["k"], r["w"], r["u"]) for r in got.to_pylist())
    assert rows == [(start, 1, 1, 1, None), (start + 3, -1, 1, 1, None),
                    (start + 3, 1, 1, 10, "x")]


def test_schema_mode_merge_on_append_and_upsert(tmp_path):
    t = _keyed(tmp_path)
    t.upsert([{"k": 1, "v": 1}])
    with pytest.raises(SchemaMismatchError, match="unit"):
        t.upsert([{"k": 2, "v": 2, "unit": "C"}])
    t.upsert([{"k": 2, "v": 2, "unit": "C"}], schema_mode="merge")
    assert t.schema.names[-1] == "unit"
    assert t.to_arrow(columns=["k", "unit"]).sort_by("k").to_pylist() == \
        [{"k": 1, "unit": None}, {"k": 2, "unit": "C"}]
    # Another writer added "x" as an int meanwhile: a string "x" is refused.
    stale = t.checkout(t.version)
    t.add_columns(pa.field("x", pa.int64()))
    with pytest.raises(SchemaMismatchError, match="column 'x' is int64"):
        stale.upsert([{"k": 5, "x": "text"}], schema_mode="merge")
    # The same type: both agree, nothing more is committed for the column.
    version = t.version
    stale.upsert([{"k": 5, "x": 7}], schema_mode="merge")
    assert stale.version == version + 1
    with pytest.raises(ValueError, match="schema_mode"):
        t.append([{"k": 3}], schema_mode="loose")
    assert t.append([{"k": 3, "extra": 1}], schema_mode="merge") == t.version
    assert t.schema.field("extra").type == pa.int64()


@pytest.mark.parametrize("verb,rows,error", [
    ("upsert", [{"k": 2, "v": "two", "unit": "C"}], "column 'v'"),
    ("upsert", [{"k": None, "unit": "C"}], "column 'k'"),
    ("upsert", [{"k": 3, "unit": "C"}, {"k": 3, "unit": "F"}], "k=3"),
    ("append", [{"k": 1, "unit": "C"}], "k=1"),
])
def test_schema_mode_merge_refusing_the_rows_adds_no_column(tmp_path, verb, rows, error):
    t = _keyed(tmp_path)
    t.upsert([{"k": 1, "v": 1}])
    with pytest.raises((SchemaMismatchError, DuplicateKeyError), match=error):
        getattr(t, verb)(rows, schema_mode="merge")
    again = Supertable.open(t.uri)
    assert again.version == 1 and "unit" not in again.schema.names


def test_racing_writers_add_columns_and_lose_nothing(tmp_path):
    t = _keyed(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = [sys.executable, "-m", "tests.beam_supertable.evolve_proc"]
    procs = [subprocess.Popen(run + ["upsert", t.uri, "a", "0", "4"], cwd=ROOT, env=env),
             subprocess.Popen(run + ["upsert", t.uri, "b", "100", "4"], cwd=ROOT, env=env),
             subprocess.Popen(run + ["add", t.uri, "c"], cwd=ROOT, env=env)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    t.refresh()
    assert set(t.schema.names) == {"_id", "k", "v", "s", "a", "b", "c"}
    got = t.to_arrow().drop_columns(["_id"]).sort_by("k").to_pylist()
    assert [r["k"] for r in got] == [0, 1, 2, 3, 100, 101, 102, 103]
    for r in got:
        column = "a" if r["k"] < 100 else "b"
        assert r[column] == f"{column}{r['k']}" and r["c"] is None
    assert len({fields.field_id(f) for f in t.schema}) == len(t.schema)
    assert _iceberg_rows(t, t.version) == _rows(t.to_arrow())


# -- Beam --------------------------------------------------------------------------
RUNNERS = ["DirectRunner"]   # the Flink runner joins this list in the flink suite


@pytest.mark.parametrize("runner", RUNNERS)
def test_upsert_to_supertable_merges_new_columns(tmp_path, runner):
    t = _keyed(tmp_path)
    t.upsert([{"k": 1, "v": 1, "s": "a"}])
    commands = [TimestampedValue(UpsertCommand(2, {"k": 2, "v": 2, "unit": "C"}, 1), 10),
                TimestampedValue(UpsertCommand(1, {"k": 1, "v": 9, "note": "n"}, 2), 10)]
    with TestPipeline(runner=runner) as p:
        commits = (p | beam.Create(commands) | UpsertToSupertable(t.uri, schema_mode="merge"))
        assert_that(commits | beam.Map(lambda c: c.rows), equal_to([2]))
    t.refresh()
    assert t.to_arrow().drop_columns(["_id"]).sort_by("k").to_pylist() == [
        {"k": 1, "v": 9, "s": None, "unit": None, "note": "n"},
        {"k": 2, "v": 2, "s": None, "unit": "C", "note": None}] or \
        t.to_arrow().drop_columns(["_id"]).sort_by("k").to_pylist() == [
        {"k": 1, "v": 9, "s": None, "note": "n", "unit": None},
        {"k": 2, "v": 2, "s": None, "note": None, "unit": "C"}]


def test_write_to_supertable_merge_adds_no_column_for_a_row_it_rejects(tmp_path):
    uri = str(tmp_path / "w")
    Supertable.create(uri, pa.schema([("a", pa.int64())]))
    with TestPipeline(runner="DirectRunner") as p:
        result = (p | beam.Create([{"a": 1, "n": 5}, {"a": "x", "bad": 1}])
                  | WriteToSupertable(uri, schema_mode="merge").with_invalid_output())
        assert_that(result.invalid | beam.Map(lambda i: i.element["a"]), equal_to(["x"]))
    t = Supertable.open(uri)
    assert t.schema.names == ["_id", "a", "n"] and t.count_rows() == 1


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("exists", [True, False])
def test_write_to_supertable_merges_new_columns(tmp_path, runner, exists):
    uri = str(tmp_path / "w")
    schema = pa.schema([("a", pa.string())])
    if exists:
        Supertable.create(uri, schema)
    with TestPipeline(runner=runner) as p:
        commits = (p | beam.Create([{"a": "p"}, {"a": "q", "n": 5}])
                   | WriteToSupertable(uri, schema=schema, schema_mode="merge"))
        assert_that(commits | beam.Map(lambda c: c.rows), equal_to([2]))
    got = Supertable.open(uri).to_arrow(columns=["a", "n"]).sort_by("a").to_pylist()
    assert got == [{"a": "p", "n": None}, {"a": "q", "n": 5}]


@pytest.mark.parametrize("runner", RUNNERS)
def test_read_changes_across_schema_changes(tmp_path, runner):
    from beam_supertable import ReadChangesFromSupertable
    t = _keyed(tmp_path)
    start = t.upsert([{"k": 1, "v": 1, "s": "a"}]) - 1
    t.rename_column("v", "w")
    t.add_columns(pa.field("u", pa.string()))
    t.upsert([{"k": 1, "w": 2, "u": "x"}])
    end = t.drop_columns("s")
    with TestPipeline(runner=runner) as p:
        changes = p | ReadChangesFromSupertable(t.uri, start_version=start, end_version=end)
        assert_that(changes | beam.Map(lambda c: (c.key, c.diff, sorted(c.value.items()))),
                    equal_to([(1, 1, [("k", 1), ("u", None), ("w", 1)]),
                              (1, -1, [("k", 1), ("u", None), ("w", 1)]),
                              (1, 1, [("k", 1), ("u", "x"), ("w", 2)])]))


# -- the property -----------------------------------------------------------------
NAMES = ["a", "b", "c"]
_op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(NAMES), st.sampled_from(["int", "str"])),
    st.tuples(st.just("drop"), st.sampled_from(NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("widen"), st.sampled_from(NAMES)),
    st.tuples(st.just("upsert"), st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
              st.integers(0, 99)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("optimize")),
    st.tuples(st.just("vacuum")),
)


def _apply(t, op, columns, rows):
    """Applies ``op`` to the table and to the model; False when it does not apply."""
    kind = op[0]
    if kind == "add":
        if op[1] in columns:
            return False
        columns[op[1]] = pa.int32() if op[2] == "int" else pa.string()
        t.add_columns(pa.field(op[1], columns[op[1]]))
        for row in rows.values():
            row[op[1]] = None
    elif kind == "drop":
        if op[1] not in columns:
            return False
        t.drop_columns(op[1])
        del columns[op[1]]
        for row in rows.values():
            del row[op[1]]
    elif kind == "rename":
        if op[1] not in columns or op[2] in columns:
            return False
        t.rename_column(op[1], op[2])
        columns[op[2]] = columns.pop(op[1])
        for row in rows.values():
            row[op[2]] = row.pop(op[1])
    elif kind == "widen":
        if columns.get(op[1]) != pa.int32():
            return False
        t.alter_column(op[1], pa.int64())
        columns[op[1]] = pa.int64()
    elif kind == "upsert":
        batch = []
        for key in op[1]:
            row = {"k": key}
            for i, (name, kind_) in enumerate(columns.items()):
                value = (op[2] + key + i) % 5
                row[name] = None if value == 0 else (value if kind_ != pa.string() else f"s{value}")
            batch.append(row)
            rows[key] = dict(row)
        t.upsert(batch)
    elif kind == "delete":
        t.delete(pc.field("k") == op[1])
        rows.pop(op[1], None)
    elif kind == "optimize":
        t.optimize()
    else:
        t.vacuum(retain_versions=3, older_than=0)
    return True


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_op, min_size=3, max_size=9))
def test_every_version_reads_as_the_model_for_us_and_pyiceberg(tmp_path_factory, ops):
    t = Supertable.create(str(tmp_path_factory.mktemp("p") / "t"),
                          pa.schema([pa.field("k", pa.int64(), nullable=False)]), primary_key="k")
    columns, rows = {}, {}
    models = {t.version: []}
    for op in ops:
        _apply(t, op, columns, rows)
        models[t.version] = sorted((tuple(sorted(r.items())) for r in rows.values()), key=repr)
    for version, model in models.items():
        try:
            handle = t.checkout(version)
        except VersionNotFoundError:
            continue   # vacuumed
        ours = _rows(handle.to_arrow())
        assert ours == model, (version, ops)
        if version:
            assert _iceberg_rows(t, version) == ours, (version, ops)


def test_inspect_shows_the_schema_history(tmp_path):
    from beam_supertable.table.inspection import inspect_table
    t = _keyed(tmp_path)
    t.add_columns(pa.field("u", pa.string()))
    t.rename_column("u", "unit")
    report = inspect_table(t.uri)["schema"]
    assert report["history"] == [{"version": 1, "change": "add u string"},
                                 {"version": 2, "change": "rename u to unit"}]
    assert report["columns"][-1] == {"name": "unit", "id": 5, "type": "string"}
    assert report["last_column_id"] == 5


def test_add_columns_reads_no_superfile_byte(tmp_path):
    t = _keyed(tmp_path)
    t.upsert([{"k": i, "v": i, "s": "x"} for i in range(50)])
    before = t.io.snapshot()
    t.add_columns([pa.field("p", pa.string()), pa.field("q", pa.float64())])
    assert t.io.snapshot() == before    # no superfile byte read


# -- the jobs -----------------------------------------------------------------------
def test_load_job_with_schema_mode_merge(tmp_path):
    from beam_supertable.jobs import load_supertable
    table = str(tmp_path / "t")
    pq.write_table(pa.table({"n": pa.array([1, 2], pa.int64()), "body": ["a", "b"]}),
                   tmp_path / "a.parquet")
    load_supertable.run(["--input", str(tmp_path / "a.parquet"), "--table", table])
    pq.write_table(pa.table({"n": pa.array([3], pa.int64()), "body": ["c"],
                             "unit": ["C"]}), tmp_path / "b.parquet")
    later = ["--input", str(tmp_path / "b.parquet"), "--table", table]
    with pytest.raises(Exception, match="unit"):
        load_supertable.run(later)
    counts = load_supertable.run(later + ["--schema-mode", "merge"])
    assert counts["rows_committed"] == 1
    got = Supertable.open(table).to_arrow(columns=["n", "unit"]).sort_by("n").to_pylist()
    assert got == [{"n": 1, "unit": None}, {"n": 2, "unit": None}, {"n": 3, "unit": "C"}]


def test_upsert_job_with_schema_mode_merge(tmp_path):
    import json
    from beam_supertable.jobs import upsert_to_supertable
    table = str(tmp_path / "t")

    def write(name, commands):
        path = tmp_path / name
        path.write_text("".join(json.dumps(c) + "\n" for c in commands))
        return str(path)

    first = write("a.jsonl", [{"key": "s1", "offset": 1, "time": 100,
                               "value": {"id": "s1", "reading": 3}}])
    upsert_to_supertable.run(["--commands", first, "--table", table, "--primary-key", "id"])
    second = write("b.jsonl", [{"key": "s2", "offset": 2, "time": 200,
                                "value": {"id": "s2", "reading": 4, "unit": "C"}}])
    upsert_to_supertable.run(["--commands", second, "--table", table, "--schema-mode", "merge"])
    got = Supertable.open(table).to_arrow(columns=["id", "unit"]).sort_by("id").to_pylist()
    assert got == [{"id": "s1", "unit": None}, {"id": "s2", "unit": "C"}]


def test_cli_inspect_prints_the_schema_history(tmp_path):
    t = _keyed(tmp_path)
    t.add_columns(pa.field("u", pa.string()))
    t.drop_columns("s")
    out = subprocess.run([sys.executable, "-m", "beam_supertable", "inspect", "--table", t.uri],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    assert "  schema      k int64 (id 2), v int32 (id 3), u string (id 5); last column id 5" \
        in out
    assert "version 1: add u string" in out and "version 2: drop s" in out


@pytest.mark.parametrize("call, error, words", [
    (lambda t: t.drop_columns(None), TypeError, "drop_columns takes a column name"),
    (lambda t: t.drop_columns(["v", "v"]), SchemaMismatchError, "'v' is given twice"),
    (lambda t: t.alter_column("v", "int64"), TypeError, "column 'v'"),
    (lambda t: t.add_columns({"u": pa.string()}), TypeError, "got dict"),
    (lambda t: t.merge_insert(5), TypeError, "on= takes a column name"),
    (lambda t: t.update(None, [("v", 1)]), TypeError, "values= takes a dict"),
])
def test_wrong_argument_shapes_are_one_line(tmp_path, call, error, words):
    t = _keyed(tmp_path)
    with pytest.raises(error, match=words) as err:
        call(t)
    assert "\n" not in str(err.value) and t.refresh().version == 0


def test_a_write_from_before_a_drop_and_add_again_loses_no_value_silently(tmp_path):
    t = _keyed(tmp_path)
    t.upsert([{"k": 1, "v": 1, "s": "a"}])
    stale = Supertable.open(t.uri)
    t.drop_columns("s")
    t.add_columns(pa.field("s", pa.string()))            # a new column under the old name
    version = t.version
    with pytest.raises(SchemaMismatchError, match=r"column 's' .*refresh\(\)"):
        stale.upsert([{"k": 2, "v": 2, "s": "kept?"}])
    assert Supertable.open(t.uri).version == version
    stale.upsert([{"k": 3, "v": 3}])                       # no value of "s": nothing to lose
    stale.refresh().upsert([{"k": 2, "v": 2, "s": "kept"}])
    assert t.refresh().to_arrow(columns=["k", "s"]).sort_by("k").to_pylist() == [
        {"k": 1, "s": None}, {"k": 2, "s": "kept"}, {"k": 3, "s": None}]
