"""Row digests against a plain-Python model: equal digests exactly for equal multisets of rows."""

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable.format.digest import combine, row_digest

SCHEMA = pa.schema([
    ("i", pa.int64()), ("f", pa.float32()), ("s", pa.string()),
    ("v", pa.list_(pa.float32(), 2)), ("tags", pa.list_(pa.string())), ("b", pa.bool_()),
])

_values = {
    "i": st.one_of(st.none(), st.integers(-3, 3), st.just(2 ** 62)),
    "f": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, 2.0, -1.0])),
    "s": st.one_of(st.none(), st.sampled_from(["", "a", "ab", "ba", "\x00", "é", "a" * 40])),
    "v": st.sampled_from([[0.0, 1.0], [1.0, 0.0], [1.5, 1.5]]),
    "tags": st.one_of(st.none(), st.lists(st.sampled_from(["", "x", "y", "xy"]), max_size=3)),
    "b": st.one_of(st.none(), st.booleans()),
}
_row = st.fixed_dictionaries(_values)
_rows = st.lists(_row, max_size=12)


def _table(rows):
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _key(row):
    # -0.0 == 0.0 in Python, but they are different values in a column.
    # By column name: hypothesis may build a row's dict in any key order.
    return tuple((v, str(v)) if isinstance(v, float) else
                 tuple(v) if isinstance(v, list) else v
                 for v in (row[name] for name in SCHEMA.names))


@settings(max_examples=200, deadline=None)
@given(a=_rows, b=_rows)
def test_digests_are_equal_exactly_for_equal_multisets_of_rows(a, b):
    same = Counter(map(_key, a)) == Counter(map(_key, b))
    assert (row_digest(_table(a)) == row_digest(_table(b))) == same


@settings(max_examples=100, deadline=None)
@given(rows=_rows, data=st.data())
def test_a_digest_does_not_depend_on_order_split_or_chunking(rows, data):
    whole = row_digest(_table(rows))
    order = data.draw(st.permutations(range(len(rows))))
    shuffled = [rows[i] for i in order]
    cut = data.draw(st.integers(0, len(rows)))
    assert combine([row_digest(_table(shuffled[:cut])), row_digest(_table(shuffled[cut:]))]) \
        == whole
    chunked = pa.Table.from_batches(_table(shuffled).to_batches(max_chunksize=3), schema=SCHEMA)
    assert row_digest(chunked) == whole
    assert row_digest(_table(shuffled).slice(cut)) == row_digest(_table(shuffled[cut:]))


def test_compiled_float_lists_give_the_numpy_digest(monkeypatch):
    # Large vector columns are hashed by a compiled pass; it must agree with
    # the numpy formulas bit for bit (signed zeros, infinities, NaN, slices,
    # null lists, float64, lists of varying length, chunks).
    import numpy as np

    from beam_supertable.format import digest

    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 13)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = -0.0, np.inf, np.nan, -np.inf
    flat = pa.array(x.ravel())
    tables = [
        pa.table({"v": pa.FixedSizeListArray.from_arrays(flat, 13)}),
        pa.table({"v": pa.FixedSizeListArray.from_arrays(flat.cast(pa.float64()), 13)}).slice(7, 250),
        pa.table({"v": pa.array([list(r[:i % 14]) for i, r in enumerate(x)], pa.list_(pa.float32()))}),
        pa.table({"v": pa.array([None if i % 5 == 0 else list(r) for i, r in enumerate(x)],
                                pa.list_(pa.float32(), 13))}),
        pa.concat_tables([pa.table({"v": pa.FixedSizeListArray.from_arrays(flat, 13)})] * 3),
    ]
    for table in tables:
        monkeypatch.setattr(digest, "_KERNEL_BYTES", 1)
        compiled = row_digest(table)
        monkeypatch.setattr(digest, "_KERNEL_BYTES", 1 << 62)
        assert compiled == row_digest(table)


_SPECIAL = st.sampled_from([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.5, -2.25])
_VALUES = st.one_of(_SPECIAL, st.floats(width=32, allow_nan=True, allow_infinity=True))


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 9), data=st.data(), wide=st.booleans(), fixed=st.booleans(),
       nulls=st.booleans())
def test_the_compiled_digest_of_float_lists_is_the_numpy_digest(dim, data, wide, fixed, nulls,
                                                               ):
    # Any float vectors: the compiled pass and the numpy formulas agree bit for bit,
    # whatever the values, the width, fixed or variable lengths, nulls and the slice.
    from beam_supertable.format import digest

    n = data.draw(st.integers(1, 30))
    lengths = [dim] * n if fixed else data.draw(st.lists(st.integers(0, dim), min_size=n,
                                                        max_size=n))
    rows = [data.draw(st.lists(_VALUES, min_size=m, max_size=m)) for m in lengths]
    if nulls:
        rows = [None if data.draw(st.booleans()) else r for r in rows]
    kind = pa.float64() if wide else pa.float32()
    table = pa.table({"v": pa.array(rows, pa.list_(kind, dim) if fixed else pa.list_(kind))})
    start = data.draw(st.integers(0, n - 1))
    table = table.slice(start)
    old = digest._KERNEL_BYTES
    try:
        digest._KERNEL_BYTES = 1
        compiled = row_digest(table)
        digest._KERNEL_BYTES = 1 << 62
        assert compiled == row_digest(table)
    finally:
        digest._KERNEL_BYTES = old
