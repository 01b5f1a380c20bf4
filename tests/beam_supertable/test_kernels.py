"""The compiled vector kernels against plain numpy references."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable.vector import codes, kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = dict(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reference_scan(aug, store, runs, depth):
    """Per query: the ``depth`` lowest (score, entry) of all its runs' scores."""
    full = aug.astype(np.float64) @ store.astype(np.float64)
    out = []
    for q in range(len(aug)):
        entries = np.concatenate([np.arange(a, b) for a, b, qs in runs if q in qs] or
                                 [np.empty(0, np.int64)]).astype(np.int64)
        order = np.lexsort((entries, full[q, entries]))[:depth]
        out.append((entries[order], full[q, entries[order]]))
    return out


@st.composite
def scans(draw):
    dim = draw(st.integers(1, 9))
    n_q = draw(st.integers(1, 6))
    cuts = sorted(set(draw(st.lists(st.integers(0, 120), min_size=2, max_size=7))))
    spans = list(zip(cuts[:-1], cuts[1:]))
    entries = cuts[-1] + draw(st.integers(0, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # Small integers make ties common (exercising the lower-entry rule) and
    # keep every product exact in float32.
    store = rng.integers(-4, 5, (dim + 1, entries)).astype(np.float32)
    aug = rng.integers(-3, 4, (n_q, dim + 1)).astype(np.float32)
    runs = [(a, b, sorted(set(draw(st.lists(st.integers(0, n_q - 1), max_size=n_q)))))
            for a, b in spans]
    depth = draw(st.integers(1, 40))
    return aug, store, runs, depth


@given(scans())
@settings(**SETTINGS)
def test_scan_topk_matches_numpy(case):
    aug, store, runs, depth = case
    runs = [r for r in runs if r[2]]
    qptr = np.cumsum([0] + [len(qs) for _, _, qs in runs])
    qids = np.array([q for _, _, qs in runs for q in qs], dtype=np.int64)
    scores, entries, counts = kernels.scan_topk(
        aug, store, np.array([a for a, _, _ in runs], dtype=np.int64),
        np.array([b for _, b, _ in runs], dtype=np.int64), qptr, qids, depth)
    for q, (want_e, want_s) in enumerate(_reference_scan(aug, store, runs, depth)):
        assert counts[q] == len(want_e)
        np.testing.assert_array_equal(entries[q, :counts[q]], want_e)
        np.testing.assert_allclose(scores[q, :counts[q]], want_s, rtol=1e-6, atol=1e-6)


def test_scan_topk_float_scores_within_tolerance():
    # Real-valued data: the same ids wherever the reference's scores are apart.
    rng = np.random.default_rng(7)
    store = rng.standard_normal((33, 900)).astype(np.float32)
    aug = rng.standard_normal((20, 33)).astype(np.float32)
    runs = [(0, 300, list(range(0, 20, 2))), (300, 700, list(range(20))), (700, 900, [1, 5])]
    qptr = np.cumsum([0] + [len(qs) for _, _, qs in runs])
    qids = np.array([q for _, _, qs in runs for q in qs])
    scores, entries, counts = kernels.scan_topk(
        aug, store, np.array([0, 300, 700]), np.array([300, 700, 900]), qptr, qids, 30)
    for q, (want_e, want_s) in enumerate(_reference_scan(aug, store, runs, 30)):
        assert counts[q] == 30
        np.testing.assert_array_equal(entries[q], want_e)
        np.testing.assert_allclose(scores[q], want_s, rtol=1e-4, atol=1e-4)


@given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 200), st.integers(1, 60),
       st.integers(0, 2**32 - 1))
@settings(**SETTINGS)
def test_hamming_topk_matches_numpy(n_bytes, n_q, n_rows, keep, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 256, (n_rows, n_bytes), dtype=np.uint8)
    qbits = rng.integers(0, 256, (n_q, n_bytes), dtype=np.uint8)
    got = kernels.hamming_topk(qbits, bits, keep)
    assert got.shape == (n_q, min(keep, n_rows))
    for q in range(n_q):
        ham = codes.hamming(qbits[q], bits)
        # The reference: the first ``keep`` rows by (distance, row), in row order.
        want = np.sort(np.lexsort((np.arange(n_rows), ham))[:keep])
        np.testing.assert_array_equal(got[q], want)


def test_scan_runs_on_threads_together():
    # The kernel releases the GIL: threads scanning at once get the answers
    # of one thread alone.
    rng = np.random.default_rng(3)
    store = rng.standard_normal((17, 4000)).astype(np.float32)
    aug = rng.standard_normal((64, 17)).astype(np.float32)
    args = (np.array([0, 2000]), np.array([2000, 4000]), np.array([0, 64, 128]),
            np.concatenate([np.arange(64), np.arange(64)]), 12)
    want = kernels.scan_topk(aug, store, *args)
    got = [None] * 4

    def run(i):
        got[i] = kernels.scan_topk(aug, store, *args)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g in got:
        for a, b in zip(g, want):
            np.testing.assert_array_equal(a, b)


def test_cache_folder_falls_back_to_user_then_temporary(tmp_path):
    assert kernels.cache_folder({"NUMBA_CACHE_DIR": "/x"}, False) is None
    assert kernels.cache_folder({"HOME": str(tmp_path)}, True) is None
    got = kernels.cache_folder({"HOME": str(tmp_path)}, False)
    assert got == os.path.join(str(tmp_path), ".cache", "beam-supertable", "numba")
    assert os.path.isdir(got)
    (tmp_path / "file").write_text("")   # a HOME under which no folder can be made
    got = kernels.cache_folder({"HOME": str(tmp_path / "file")}, False)
    assert got is not None and not got.startswith(str(tmp_path))


def test_compiled_kernels_are_cached_on_disk(tmp_path):
    # A second process loads the machine code the first one wrote.
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "jit"),
           "PYTHONPATH": os.pathsep.join([ROOT] + [p for p in sys.path if "numba" in p])}
    script = (
        "import numpy as np\n"
        "from beam_supertable.vector import kernels\n"
        "kernels.hamming_topk(np.zeros((1, 1), np.uint8), np.zeros((3, 1), np.uint8), 2)\n"
        "print(kernels._hamming.stats.cache_hits)\n")
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, check=True).stdout.split() for _ in range(2)]
    names = [n for _, _, ns in os.walk(tmp_path / "jit") for n in ns]
    assert any(n.endswith(".nbi") for n in names) and any(n.endswith(".nbc") for n in names)
    assert runs[0] == ["Counter()"] and runs[1] != ["Counter()"]


def _reference_seeds(x, n_centres, seed):
    """k-means++ with one trial a centre in plain numpy: RandomState draws, float32
    squared distances, the first row whose running sum reaches the draw."""
    rs = np.random.RandomState(seed)
    out = [int(rs.choice(len(x), p=np.full(len(x), 1.0 / len(x))))]
    x64 = x.astype(np.float64)
    closest = ((x64 - x64[out[0]]) ** 2).sum(axis=1).astype(np.float32)
    for _ in range(n_centres - 1):
        r = rs.uniform() * closest.sum()
        c = min(int(np.searchsorted(np.cumsum(closest), r)), len(x) - 1)
        out.append(c)
        closest = np.minimum(closest, ((x64 - x64[c]) ** 2).sum(axis=1).astype(np.float32))
    return np.array(out)


@given(st.integers(1, 80), st.integers(1, 6), st.integers(1, 30), st.integers(0, 2**32 - 1))
@settings(**SETTINGS)
def test_kmeans_plusplus_matches_numpy(n, dim, n_centres, seed):
    # Small integers: every distance and running sum is exact in both.
    x = np.random.default_rng(seed).integers(-3, 4, (n, dim)).astype(np.float32)
    got = kernels.kmeans_plusplus(x, n_centres, seed)
    np.testing.assert_array_equal(got, _reference_seeds(x, min(n_centres, n), seed))


def test_kmeans_plusplus_picks_scikit_learns_seeds():
    from sklearn.cluster import kmeans_plusplus

    x = np.random.default_rng(4).normal(size=(3000, 24)).astype(np.float32)
    _, want = kmeans_plusplus(x, 150, random_state=0, n_local_trials=1)
    np.testing.assert_array_equal(kernels.kmeans_plusplus(x, 150, 0), want)


@pytest.mark.parametrize("metric", ["l2", "cosine", "dot"])
def test_search_answers_as_the_numpy_path(tmp_path, monkeypatch, metric):
    """The compiled scan and the numpy path give a search the same rows, first
    from SQ8 codes (a cold handle probing many runs) and then warm."""
    import pyarrow as pa

    from beam_supertable import Supertable
    from beam_supertable.vector import dense
    from beam_supertable.vector import search as vsearch

    rng = np.random.default_rng(11)
    centres = rng.normal(size=(20, 16)) * 3
    x = (centres[rng.integers(0, 20, 3000)] + rng.normal(size=(3000, 16))).astype(np.float32)
    data = pa.table({"id": pa.array(np.arange(len(x))),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 16)})
    uri = str(tmp_path / "t")
    Supertable.create(uri, data.schema, vector_column="emb", metric=metric).append(data)
    q = (centres[rng.integers(0, 20, 40)] + rng.normal(size=(40, 16))).astype(np.float32)
    monkeypatch.setattr(dense, "DENSE_MAX_BYTES", 0)
    answers = {}
    for compiled in (True, False):
        monkeypatch.setattr(vsearch, "COMPILED_SCAN", compiled)
        t = Supertable.open(uri)
        answers[compiled] = [t.search(vector=q, k=7, nprobe=12, columns=["id"]) for _ in range(2)]
    for mine, theirs in zip(answers[True], answers[False]):
        assert mine["id"].to_pylist() == theirs["id"].to_pylist()
        np.testing.assert_allclose(mine["_distance"].to_numpy(), theirs["_distance"].to_numpy(),
                                   rtol=1e-5, atol=1e-5)
