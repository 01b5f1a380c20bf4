"""ObjectStore semantics on every backend, the S3 server included."""

import threading

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from beam_supertable import AlreadyExists, UnsafeBackendError
from beam_supertable.format.store import ObjectStore


@pytest.fixture
def store(table_location):
    uri, options = table_location
    return ObjectStore(uri, options)


def test_put_get_range_head_list_delete(store):
    store.put("a/b.bin", b"0123456789")
    store.put("a/c.bin", b"xy")
    store.put("z.bin", b"")
    assert store.get("a/b.bin") == b"0123456789"
    assert store.get_range("a/b.bin", 2, 5) == b"234"
    assert store.get_range("a/b.bin", -3, None) == b"789"
    info = store.head("a/b.bin")
    assert info.size == 10 and info.path == "a/b.bin"
    assert [o.path for o in store.list("a")] == ["a/b.bin", "a/c.bin"]
    assert [o.path for o in store.list("")] == ["a/b.bin", "a/c.bin", "z.bin"]
    store.put("a/b.bin", b"new")
    assert store.get("a/b.bin") == b"new"
    store.delete("a/b.bin")
    store.delete("a/b.bin")  # deleting a missing object is fine
    assert not store.exists("a/b.bin")
    with pytest.raises(FileNotFoundError, match="a/b.bin"):
        store.get("a/b.bin")
    with pytest.raises(FileNotFoundError, match="nothing"):
        store.head("nothing")
    assert store.list("missing/") == []


def test_put_if_absent_creates_once(store):
    store.put_if_absent("v/1.json", b"first")
    with pytest.raises(AlreadyExists, match="v/1.json") as exc:
        store.put_if_absent("v/1.json", b"second")
    assert isinstance(exc.value, FileExistsError)
    assert store.get("v/1.json") == b"first"


def test_racing_creates_have_exactly_one_winner(store):
    winners, barrier = [], threading.Barrier(8)

    def create(i):
        barrier.wait()
        try:
            store.put_if_absent("race.json", f"writer {i}".encode())
            winners.append(i)
        except AlreadyExists:
            pass

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.get("race.json") == f"writer {winners[0]}".encode()


def test_a_listing_does_not_hide_objects_another_writer_creates_later(table_location):
    uri, options = table_location
    reader = ObjectStore(uri, options)
    # Another process: its own client (s3fs would share one per settings otherwise).
    other = ObjectStore(uri, {**options, "skip_instance_cache": True} if options else None)
    reader.put("v/1.json", b"1")
    assert [o.path for o in reader.list("v")] == ["v/1.json"]
    other.put_if_absent("v/2.json", b"22")
    assert reader.exists("v/2.json")
    assert reader.head("v/2.json").size == 2


def test_local_create_leaves_no_temporary_files(tmp_path):
    store = ObjectStore(str(tmp_path))
    store.put_if_absent("x.bin", b"1")
    with pytest.raises(AlreadyExists):
        store.put_if_absent("x.bin", b"2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]


def test_file_uri_is_a_local_store(tmp_path):
    store = ObjectStore(f"file://{tmp_path}")
    store.put_if_absent("f.bin", b"1")
    assert (tmp_path / "f.bin").read_bytes() == b"1"


class PlainMemory(MemoryFileSystem):
    """A backend with no atomic create, as far as ObjectStore knows."""

    protocol = "plainmem"


fsspec.register_implementation("plainmem", PlainMemory, clobber=True)


def test_backend_without_atomic_create_is_refused_unless_single_writer():
    store = ObjectStore("plainmem://t")
    assert store.get_range  # reading is always allowed
    with pytest.raises(UnsafeBackendError, match="single_writer=True"):
        store.put_if_absent("a", b"1")
    single = ObjectStore("plainmem://t", single_writer=True)
    single.put_if_absent("a", b"1")
    with pytest.raises(AlreadyExists):
        single.put_if_absent("a", b"2")


def test_store_pickles_as_settings_only(table_location):
    import pickle

    uri, options = table_location
    store = ObjectStore(uri, options)
    clone = pickle.loads(pickle.dumps(store))
    store.put("p.bin", b"1")
    assert clone.get("p.bin") == b"1"


@pytest.mark.s3
def test_s3_objects_created_elsewhere_are_seen_after_a_listing(s3_server, s3_bucket):
    from tests.conftest import s3_options

    uri, options = f"s3://{s3_bucket}/t", s3_options(s3_server)
    here = ObjectStore(uri, options)
    here.put("v/0", b"zero")
    assert [o.path for o in here.list("v")] == ["v/0"]  # s3fs would cache this listing
    # Another process's client: creating v/1 there invalidates nothing here.
    ObjectStore(uri, {**options, "skip_instance_cache": True}).put_if_absent("v/1", b"one")
    assert ObjectStore(uri, options).exists("v/1")   # a second handle on the same instance
    assert here.exists("v/1") and here.head("v/1").size == 3
    assert here.get("v/1") == b"one"
    assert [o.path for o in here.list("v")] == ["v/0", "v/1"]


@pytest.mark.s3
def test_s3_racing_creates_have_exactly_one_winner_per_object(s3_server, s3_bucket):
    # The commit protocol rests on this: of N writers creating one object,
    # exactly one succeeds. Each writer has its own client, as processes do;
    # many objects, because a check-then-write server loses only some races,
    # and bodies of 64 KiB, which widen the window between the two.
    import threading

    from tests.conftest import s3_options

    options = {**s3_options(s3_server), "skip_instance_cache": True}
    stores = [ObjectStore(f"s3://{s3_bucket}/race", options) for _ in range(6)]
    winners = {k: [] for k in range(30)}
    barrier = threading.Barrier(len(stores))

    def body(i):
        return f"writer {i}".encode().ljust(1 << 16, b".")

    def create(i):
        for k in range(30):
            barrier.wait()
            try:
                stores[i].put_if_absent(f"v/{k}.json", body(i))
                winners[k].append(i)
            except AlreadyExists:
                pass

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doubled = {k: w for k, w in winners.items() if len(w) != 1}
    assert not doubled, f"objects created by more than one writer (or none): {doubled}"
    for k, (w,) in winners.items():
        assert stores[0].get(f"v/{k}.json") == body(w)
