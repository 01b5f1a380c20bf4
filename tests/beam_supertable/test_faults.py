"""A store that fails, times out, storms AlreadyExists and truncates reads."""

import random
import uuid

import pyarrow as pa
import pytest

from beam_supertable import AlreadyExists, CommitConflictError, CorruptManifestError
from beam_supertable.format.manifest import CommitRequest, Manifest
from beam_supertable.format.store import ObjectStore

SCHEMA = pa.schema([("_id", pa.int64()), ("x", pa.int64())])


class FaultyStore(ObjectStore):
    """Wraps a real store; every call may fail the way object stores fail."""

    def __init__(self, uri, rng, rate):
        super().__init__(uri)
        self.rng, self.rate, self.on = rng, rate, True

    def _maybe_fail(self, what):
        if self.on and self.rng.random() < self.rate:
            raise self.rng.choice([OSError(f"injected: {what} failed"),
                                   TimeoutError(f"injected: {what} timed out")])

    def get(self, path):
        self._maybe_fail("get")
        data = super().get(path)
        if self.on and self.rng.random() < self.rate and len(data) > 1:
            return data[: self.rng.randrange(1, len(data))]  # truncated read
        return data

    def exists(self, path):
        self._maybe_fail("head")
        return super().exists(path)

    def put(self, path, data, **how):
        self._maybe_fail("put")
        super().put(path, data, **how)

    def put_if_absent(self, path, data, **how):
        self._maybe_fail("create")
        if self.on and self.rng.random() < self.rate:
            raise AlreadyExists(f"injected storm: {path}")
        super().put_if_absent(path, data, **how)
        if self.on and self.rng.random() < self.rate:
            raise TimeoutError(f"injected: create of {path} landed but the reply was lost")


@pytest.mark.parametrize("seed", range(12))
def test_commits_land_exactly_once_or_fail_clearly(seed):
    uri = f"memory://faults/{uuid.uuid4().hex}"
    Manifest(ObjectStore(uri)).create(SCHEMA)
    store = FaultyStore(uri, random.Random(seed), rate=0.12)
    manifest = Manifest(store)
    manifest._sleep = lambda s: None  # backoff timing is not under test here
    landed, failed = {}, []
    for i in range(25):
        req = CommitRequest(add_entries=({"id": f"sf{i}", "path": f"data/{i}", "rows": i + 1},),
                            token=f"t{i}")
        try:
            landed[req.token] = manifest.commit(req).version
        except (CommitConflictError, OSError, TimeoutError, CorruptManifestError) as exc:
            assert str(exc), "an error must say what went wrong"
            failed.append(req)
    store.on = False
    clean = Manifest(ObjectStore(uri))
    latest = clean.latest_version()
    tokens = []
    for v in range(latest + 1):
        snap = clean.load(v)  # every version whole and hash-checked
        tokens.append(snap.commit["token"])
        assert snap.totals["superfiles"] == len(snap.entries())
    assert len([t for t in tokens if t]) == len({t for t in tokens if t})
    for token, version in landed.items():
        assert tokens[version] == token
    for req in failed:  # a retried commit with the same token never duplicates
        clean.commit(req)
        clean.commit(req)
    final = clean.load()
    assert sorted(e["id"] for e in final.entries()) == sorted(f"sf{i}" for i in range(25))
    assert final.totals["rows"] == sum(range(1, 26))
