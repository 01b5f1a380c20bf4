"""Row ids: unique by construction, whatever the random source says."""

import multiprocessing
import os
import subprocess
import sys
import uuid

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_supertable import Supertable
from beam_supertable.format import ids as ids_mod
from beam_supertable.format.ids import CLAIMS, ROW_BITS, SEQUENCE_BITS, IdAllocator, claim_path
from beam_supertable.format.store import ObjectStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _store():
    return ObjectStore(f"memory://ids/{uuid.uuid4().hex}")


def _distinct(ids):
    # np.unique of numpy 2.4 takes seconds on a few million int64s; sorting does not.
    ordered = np.sort(np.asarray(ids))
    return bool((ordered[1:] != ordered[:-1]).all())


def _claim_of(ids):
    return set((np.asarray(ids) >> (ROW_BITS + SEQUENCE_BITS)).tolist())


def test_two_writers_drawing_the_same_number_get_different_ids():
    store = _store()
    a, b = IdAllocator(store, draw=lambda bits: 7), IdAllocator(store, draw=lambda bits: 7)
    ids_a, ids_b = a.new_ids(1000), b.new_ids(1000)
    assert a.claim == 7 and b.claim == 8  # 7 was taken: b claimed the next number
    assert not set(ids_a.tolist()) & set(ids_b.tolist())
    assert _claim_of(ids_a) == {7} and _claim_of(ids_b) == {8}
    assert store.exists(claim_path(7)) and store.exists(claim_path(8))
    assert (np.asarray(ids_a) >= 0).all()


@settings(max_examples=25, deadline=None)
@given(draws=st.lists(st.integers(0, 3), min_size=2, max_size=5),
       requests=st.lists(st.tuples(st.integers(0, 4), st.integers(0, (1 << ROW_BITS) + 5)),
                         max_size=8))
def test_ids_never_repeat_across_writers(draws, requests):
    store = _store()
    allocators = [IdAllocator(store, draw=lambda bits, d=d: d) for d in draws]
    seen = []
    for which, n in requests:
        got = allocators[which % len(allocators)].new_ids(n)
        assert len(got) == n
        seen.append(got)
    every = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    assert _distinct(every)
    for claim in _claim_of(every):  # every id lies in a claim its writer holds in the store
        assert store.exists(claim_path(claim))


def test_a_claim_that_runs_out_is_followed_by_a_new_one(monkeypatch):
    monkeypatch.setattr(ids_mod, "SEQUENCE_BITS", 1)  # two blocks per claim
    store = _store()
    allocator = IdAllocator(store, draw=lambda bits: 0)
    got = allocator.new_ids(5 << ROW_BITS)
    assert _distinct(got)
    assert len(store.list(CLAIMS)) == 3


def _child_ids(allocator, queue):
    queue.put(allocator.new_ids(10).tolist())


def test_a_forked_child_does_not_reuse_its_parents_blocks(tmp_path):
    store = ObjectStore(str(tmp_path / "t"))
    allocator = IdAllocator(store)
    parent = allocator.new_ids(10).tolist()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_ids, args=(allocator, queue))
    child.start()
    forked = queue.get(timeout=60)
    child.join(timeout=60)
    more = allocator.new_ids(10).tolist()
    assert not set(forked) & set(parent + more)
    assert len(store.list(CLAIMS)) == 2


def test_a_table_created_again_under_the_same_root_is_claimed_again():
    uri = f"memory://ids/{uuid.uuid4().hex}"
    schema = pa.schema([("x", pa.int64())])
    first = Supertable.create(uri, schema)
    first.append(pa.table({"x": [1]}))
    ObjectStore(uri).fs.rm(ObjectStore(uri).root, recursive=True)
    again = Supertable.create(uri, schema)
    again.append(pa.table({"x": [2]}))
    claim = _claim_of(again.to_arrow()["_id"].to_pylist()).pop()
    assert ObjectStore(uri).exists(claim_path(claim))  # this table's own claim, not a ghost


def test_writer_processes_with_the_same_random_numbers_write_unique_ids(tmp_path):
    # Two real processes whose random source returns one constant: random
    # id blocks would collide on the first row; claimed ones cannot.
    uri = str(tmp_path / "t")
    Supertable.create(uri, pa.schema([("writer", pa.string()), ("seq", pa.int64())]))
    for writer in ("a", "b"):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.beam_supertable.writer_proc", "append-constant-random",
             uri, "null", writer, "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ids = Supertable.open(uri).to_arrow()["_id"].to_pylist()
    assert len(ids) == 4 and len(set(ids)) == 4
