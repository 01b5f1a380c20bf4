"""``vector.metric.nearest``: the picks of the probe and assignment paths against float64 distances."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable.vector.metric import METRICS, nearest, prepare


def _reference(queries, points, metric, k):
    """The ``k`` nearest by float64 distance, ties to the lower index."""
    q, p = queries.astype(np.float64), points.astype(np.float64)
    if metric == "l2":
        d = ((q[:, None, :] - p[None, :, :]) ** 2).sum(-1)
    elif metric == "cosine":
        d = 1.0 - q @ p.T
    else:
        d = -(q @ p.T)
    return np.argsort(d, axis=1, kind="stable")[:, :k], np.sort(d, axis=1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), metric=st.sampled_from(METRICS),
       n_points=st.one_of(st.integers(1, 60), st.integers(60, 1500)),
       k=st.one_of(st.integers(1, 8), st.integers(8, 70)), dim=st.integers(1, 12))
def test_the_k_nearest_are_those_of_exact_distances(seed, metric, n_points, k, dim):
    rng = np.random.default_rng(seed)
    points = prepare(rng.standard_normal((n_points, dim)).astype(np.float32), metric)
    queries = prepare(rng.standard_normal((40, dim)).astype(np.float32), metric)
    got = nearest(queries, points, metric, k)
    want, ordered = _reference(queries, points, metric, k)
    k = min(k, n_points)
    assert got.shape == (40, k)
    # float32 scores may swap picks whose distances nearly tie: compare the
    # queries whose first k + 1 distances are apart.
    gaps = np.diff(ordered[:, :k + 1], axis=1) if n_points > k else np.diff(ordered, axis=1)
    apart = (gaps > 1e-3 * (1 + np.abs(ordered[:, :1]))).all(axis=1)
    assert np.array_equal(got[apart], want[apart])
    assert all(len(set(row)) == k for row in got.tolist())


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_equal_points_go_to_the_lower_index(metric, k):
    base = prepare(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], np.float32), metric)
    points = np.repeat(base, 2, axis=0)          # each point twice: indexes 2i, 2i + 1
    query = prepare(np.array([[1.0, 0.1]], np.float32), metric)
    got = nearest(query, points, metric, k)[0].tolist()
    assert got[:2] == [0, 1][:k]
    if k >= 3:
        assert got[2:4] == [2, 3][:k - 2]


@pytest.mark.parametrize("metric", ["l2", "dot"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_scores_overflowed_by_huge_vectors_never_pick_a_point_twice(metric, k):
    """Finite vectors of ~1e20 overflow float32 products and squared norms to
    -inf (or NaN): the picks must still be ``k`` distinct points (a repeated
    probe would score a cell's rows twice)."""
    points = np.array([[1, 0], [0, 1], [-1, 0], [0, -1], [2, 2]], np.float32) * np.float32(1e20)
    queries = np.array([[1, 0.1], [-3, 1]], np.float32) * np.float32(1e20)
    with np.errstate(over="ignore", invalid="ignore"):
        got = nearest(queries, points, metric, k)
    assert got.shape == (2, k)
    assert all(len(set(row)) == k for row in got.tolist())


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("k", [1, 3, 20])
def test_the_picks_do_not_depend_on_how_the_queries_are_chunked(metric, k):
    # The default chunk follows the point count (a block of about a million
    # scores); any chunking must give the very same picks.
    rng = np.random.default_rng(7)
    points = prepare(rng.standard_normal((3000, 16)).astype(np.float32), metric)
    queries = prepare(rng.standard_normal((900, 16)).astype(np.float32), metric)
    whole = nearest(queries, points, metric, k, chunk=len(queries))
    for chunk in (None, 1, 7, 128, 4096):
        assert np.array_equal(nearest(queries, points, metric, k, chunk=chunk), whole), chunk
