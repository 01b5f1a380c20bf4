"""Why a row does not fit: found column by column, for exactly the rows conform refuses."""

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.row_reasons import find_problems, id_column, row_label
from beam_supertable.format.schema import conform

SCHEMA = pa.schema([pa.field("reading", pa.int64(), nullable=False), ("note", pa.string()),
                    ("emb", pa.list_(pa.float32(), 3)), ("tags", pa.list_(pa.string()))])
MISSING = object()

anything = (st.none() | st.booleans() | st.integers() | st.integers(-2**80, 2**80)
            | st.floats() | st.text(max_size=5) | st.binary(max_size=5))
vectors = st.lists(st.floats() | st.floats(-1e21, 1e21) | st.integers(-2**30, 2**30) | st.none()
                   | st.text(max_size=2),
                   min_size=2, max_size=4)
columns = {
    "reading": st.just(MISSING) | anything,
    "note": st.just(MISSING) | anything,
    "emb": st.just(MISSING) | anything | vectors | vectors.map(tuple),
    "tags": st.just(MISSING) | anything | st.lists(anything, max_size=3),
}
rows = st.builds(lambda values, extra: {**{k: v for k, v in values.items() if v is not MISSING},
                                        **extra},
                 st.fixed_dictionaries(columns),
                 st.dictionaries(st.sampled_from(["colour", "readng"]), anything, max_size=1))


def _conform_refuses(row) -> bool:
    """What the writes do with one row: unknown columns refused, the rest conformed."""
    if any(k not in SCHEMA.names for k in row):
        return True
    try:
        conform("t", pa.Table.from_pylist([row], schema=SCHEMA), SCHEMA, "emb")
        return False
    except (SchemaMismatchError, pa.ArrowException, TypeError, ValueError, OverflowError):
        return True


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(rows, min_size=1, max_size=6))
def test_the_rows_named_are_the_rows_conform_refuses(batch):
    problems = find_problems(batch, SCHEMA, "emb")
    assert sorted(problems) == [i for i, row in enumerate(batch) if _conform_refuses(row)]
    for reason in problems.values():   # in our words: a column, or unknown columns
        assert reason.startswith(("column '", "column(s) [")), reason


@pytest.mark.parametrize("row, reason", [
    ({"reading": "abc"}, "column 'reading' expects int64, got str 'abc'"),
    ({"note": "x"}, "column 'reading' expects int64, but the row lacks it (the column is not "
                    "nullable)"),
    ({"reading": 1, "emb": [1.0, 2.0]}, "column 'emb' expects 3 float32 values, got 2"),
    ({"reading": 1, "emb": [1.0, float("-inf"), 2.0]},
     "column 'emb' expects 3 finite float32 values, got minus infinity at position 1"),
    ({"reading": 1, "emb": [1.0, 1e20, 2.0]},
     "column 'emb': the vector is too large: its squared norm overflows float32 distances "
     "(keep it under 8.5e+37)"),
    ({"reading": 1, "emb": [1.0, None, 2.0]},
     "column 'emb' expects 3 float32 values, got null at position 1"),
    ({"reading": 1, "emb": [16777217, 0, 0]},
     "column 'emb' expects 3 float32 values, got int 16777217 at position 0"),
    ({"reading": 1, "emb": "abc"}, "column 'emb' expects 3 float32 values, got str 'abc'"),
    ({"reading": 1, "note": "x" * 100}, None),
    ({"reading": 1, "tags": ["a", 1]}, "column 'tags' expects list<item: string>, got list "
                                       "['a', 1] (Expected bytes, got a 'int' object)"),
    ({"reading": 1.5, "bad": 1}, "column(s) ['bad'] are not in the table schema "
                                 "['reading', 'note', 'emb', 'tags']"),
    ("a row", "expected a dict of the table's columns ['reading', 'note', 'emb', 'tags'], got "
              "str 'a row'"),
])
def test_each_problem_in_words(row, reason):
    vector = "emb" if isinstance(row, dict) and "emb" in row else None
    assert find_problems([row], SCHEMA, vector).get(0) == reason


def test_a_long_value_is_shortened():
    (reason,) = find_problems([{"reading": "x" * 200}], SCHEMA, None).values()
    assert reason.startswith("column 'reading' expects int64, got str 'xxx")
    assert reason.endswith("...") and len(reason) < 120


def test_a_row_is_named_by_its_id_column_else_by_its_position():
    schema = pa.schema([("doc_id", pa.string()), ("n", pa.int64())])
    assert id_column(schema) == "doc_id" and id_column(SCHEMA) is None
    assert id_column(pa.schema([("x_id", pa.int64()), ("ID", pa.int64())])) == "ID"
    assert row_label({"doc_id": "d-7"}, "3", "doc_id") == "row with doc_id 'd-7'"
    assert row_label({"doc_id": None}, "3", "doc_id") == "row 3"
    assert row_label({"n": 1}, "0 of a RecordBatch", None) == "row 0 of a RecordBatch"
