"""The compiled BM25 pass against a plain numpy reference: same scores, same best rows."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable.fts import kernels
from beam_supertable.fts.index import bm25, bm25_idf


def _reference(postings, n_rows, lengths, dfs, needed, k, avg):
    """Every term's :func:`bm25` summed per row in term order, the rows holding a term
    and every needed one; the best ``k`` by (score desc, row asc), or all (k < 0)."""
    scores = np.zeros(n_rows)
    hits = np.zeros(n_rows, dtype=int)
    present = np.zeros(n_rows, dtype=bool)
    for (rows, tf), df, need in zip(postings, dfs, needed):
        scores[rows] += bm25(tf.astype(np.float64), lengths[rows], df, n_rows, avg)
        present[rows] = True
        if need:
            hits[rows] += 1
    keep = present & (hits == sum(needed))
    rows = np.flatnonzero(keep)
    if k < 0:
        return rows, scores[rows]
    at = np.lexsort((rows, -scores[rows]))[:k]
    return rows[at], scores[rows][at]


@st.composite
def queries(draw):
    n_rows = draw(st.integers(1, 60))
    n_terms = draw(st.integers(1, 4))
    lengths = np.array(draw(st.lists(st.integers(1, 30), min_size=n_rows, max_size=n_rows)),
                       dtype=np.int32)
    postings = []
    for _ in range(n_terms):
        rows = sorted(draw(st.sets(st.integers(0, n_rows - 1), min_size=1, max_size=n_rows)))
        # Few distinct term frequencies and lengths: ties between rows are common.
        tf = draw(st.lists(st.integers(1, 3), min_size=len(rows), max_size=len(rows)))
        postings.append((np.array(rows, dtype=np.int32), np.array(tf, dtype=np.int32)))
    needed = draw(st.lists(st.booleans(), min_size=n_terms, max_size=n_terms))
    k = draw(st.sampled_from([-1, 1, 3, 10]))
    return n_rows, lengths, postings, needed, k


@settings(max_examples=60, deadline=None)
@given(queries())
def test_the_compiled_pass_scores_and_ranks_as_the_numpy_reference(q):
    n_rows, lengths, postings, needed, k = q
    avg = float(lengths.mean())
    dfs = [len(r) for r, _ in postings]
    want_rows, want_scores = _reference(postings, n_rows, lengths, dfs, needed, k, avg)
    # The postings laid out as an index holds them: one array, a span per term.
    rows = np.concatenate([r for r, _ in postings])
    tf = np.concatenate([t for _, t in postings])
    ends = np.cumsum([len(r) for r, _ in postings])
    starts = ends - [len(r) for r, _ in postings]
    idf = np.array([bm25_idf(df, n_rows) for df in dfs])
    norm = 1.2 * (1 - 0.75 + 0.75 * lengths / avg)
    got_rows, got_scores = kernels.score_top(rows, tf, starts, ends, idf, np.array(needed),
                                             norm, k)
    assert got_rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-12, atol=0)
    # As search calls it: the terms by their places in an index's term list (here
    # reversed, with one more term the query does not hold).
    ix = SimpleNamespace(rows=np.concatenate([rows, [0]]).astype(np.int32),
                         tf=np.concatenate([tf, [1]]).astype(np.int32),
                         start=np.concatenate([starts, [len(rows)]]).astype(np.int64),
                         df=np.array(dfs + [1], dtype=np.int32))
    ids = np.arange(len(dfs))
    got_rows, got_scores = kernels.index_top(ix, ids, idf, np.array(needed, dtype=np.int8),
                                             norm, k)
    assert got_rows.tolist() == want_rows.tolist()
    np.testing.assert_array_equal(got_scores, want_scores)


def test_no_row_holding_every_needed_term_gives_nothing():
    rows = np.array([0, 1, 2, 3], dtype=np.int32)
    tf = np.ones(4, dtype=np.int32)
    got = kernels.score_top(rows, tf, np.array([0, 2]), np.array([2, 4]), np.ones(2),
                            np.array([1, 1]), np.ones(4), 10)
    assert got[0].tolist() == [] and got[1].tolist() == []
