"""The CLI's add-columns, drop-columns, rename-column, restore and tag subcommands."""

import json

import pyarrow as pa
import pytest

from beam_supertable import Supertable
from beam_supertable.cli import main
from tests.beam_supertable.conftest import SMALL_SCHEMA as SCHEMA
from tests.beam_supertable.iceberg_reads import rows_of
from tests.beam_supertable.test_cli import run_cli


def _table(path, appends=2):
    t = Supertable.create(str(path / "t"), SCHEMA)
    for i in range(appends):
        t.append(pa.table({"x": [i], "s": [f"a{i}"]}))
    return t


def test_tag_create_list_delete_through_the_entry_point(tmp_path, capsys):
    t = _table(tmp_path)
    made = run_cli("tag", t.uri, "create", "nightly", "1")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"{t.uri}: tagged version 1 as nightly"
    listed = run_cli("tag", "--table", t.uri, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"uri": t.uri, "tags": {"nightly": 1}}
    capsys.readouterr()
    assert main(["tag", t.uri, "create", "nightly", "2"]) == 1
    again = capsys.readouterr()
    assert again.out == "" and again.err.count("\n") == 1
    assert "TagExistsError" in again.err and "'nightly' already exists" in again.err
    assert main(["tag", t.uri, "delete", "nightly", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == \
        {"uri": t.uri, "deleted": "nightly", "version": 1}
    assert t.tags.list() == {}
    assert main(["tag", t.uri, "list"]) == 0
    assert capsys.readouterr().out.strip() == f"{t.uri}: no tags"


@pytest.mark.parametrize("argv,expected", [
    (["tag", "{t}", "craete", "x", "1"], "unknown action 'craete' (did you mean 'create'?)"),
    (["tag", "{t}"], "the following arguments are required: ACTION"),
    (["tag", "{t}", "create", "x"], "tag create NAME VERSION: expected 2 arguments"),
    (["tag", "{t}", "create", "bad name", "1"], "got 'bad name'"),
    (["tag", "{t}", "create", "x", "one"], "VERSION must be a version number, got 'one'"),
    (["tag", "{t}", "delete"], "tag delete NAME: expected 1 argument"),
    (["restore", "{t}"], "expected one VERSION or TAG"),
    (["restore", "{t}", "1", "2"], "unexpected argument '2'"),
    (["rename-column", "{t}", "s"], "expected OLD NEW (two column names), got 1 argument"),
    (["drop-columns", "{t}"], "required: NAME"),
    (["add-columns", "{t}"], "required: --column"),
    (["add-columns", "{t}", "--column", "u:strng"],
     "--column: column 'u' has unknown type 'strng' (did you mean 'string'?)"),
    (["add-columns", "{t}", "--column", "u"], "--column: 'u' is not name:type"),
    (["add-columns", "{t}", "u:string"], "unexpected argument 'u:string'"),
    (["tag", "list"], "required: ACTION"),
])
def test_usage_mistakes_exit_2_in_one_line_and_change_nothing(tmp_path, capsys, argv, expected):
    t = _table(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([a.format(t=t.uri) for a in argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    assert Supertable.open(t.uri).version == t.version and t.tags.list() == {}


def test_a_column_the_table_lacks_is_named_with_the_closest(tmp_path, capsys):
    t = _table(tmp_path)
    assert main(["drop-columns", t.uri, "ss"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column 'ss' (did you mean 's'?)" in err
    assert main(["rename-column", "--table", t.uri, "xx", "y"]) == 1
    assert "no column 'xx' (did you mean 'x'?)" in capsys.readouterr().err
    assert Supertable.open(t.uri).version == t.version


def test_restore_a_tag_through_the_entry_point(tmp_path, capsys):
    # Needs Supertable.restore.
    t = _table(tmp_path, appends=3)
    t.tags.create("two-rows", 2)
    before = rows_of(t.checkout(2).to_arrow())
    out = run_cli("restore", t.uri, "two-rows", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["restored"] == 2 and doc["tag"] == "two-rows" and doc["version"] == 4
    assert rows_of(Supertable.open(t.uri).to_arrow()) == before
    assert main(["restore", "--table", t.uri, "3"]) == 0
    assert capsys.readouterr().out.strip() == f"{t.uri}: restored version 3 as version 5"
    assert Supertable.open(t.uri).count_rows() == 3


def test_add_rename_drop_columns_through_the_entry_point(tmp_path, capsys):
    # Needs Supertable.add_columns, rename_column and drop_columns.
    t = _table(tmp_path)
    added = run_cli("add-columns", t.uri, "--column", "unit:string",
                    "--column", "level:int32,emb:float32[2]", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["added"] == [
        {"name": "unit", "type": "string"}, {"name": "level", "type": "int32"},
        {"name": "emb", "type": "fixed_size_list<item: float>[2]"}]
    opened = Supertable.open(t.uri)
    assert opened.user_schema.field("unit").type == pa.string()
    assert opened.to_arrow(columns=["unit"])["unit"].null_count == 2
    capsys.readouterr()
    assert main(["rename-column", t.uri, "s", "label"]) == 0
    assert capsys.readouterr().out.strip().startswith(f"{t.uri}: renamed s to label in version ")
    assert main(["drop-columns", "--table", t.uri, "unit", "level"]) == 0
    final = Supertable.open(t.uri)
    assert [n for n in final.user_schema.names] == ["x", "label", "emb"]
    assert sorted(final.to_arrow(columns=["label"])["label"].to_pylist()) == ["a0", "a1"]
