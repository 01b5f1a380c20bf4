"""Real OS processes upserting overlapping keys into one keyed table at once."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from beam_supertable import Supertable
from tests.beam_supertable.iceberg_reads import assert_every_version_reads_alike
from tests.conftest import REMOTE_BACKENDS, backend_location

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])
KEYS = 16


@pytest.fixture(params=[pytest.param(("local", 8), id="local")] + [
    pytest.param((name, 3), id=name, marks=pytest.mark.slow) for name in REMOTE_BACKENDS])
def location(request, tmp_path):
    backend, *sizes = request.param
    return (*backend_location(request, backend, tmp_path), *sizes)


def test_racing_upserts_keep_one_live_row_per_key_and_the_last_committer_wins(location):
    uri, options, rounds = location
    Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    # Three writers upsert; the fourth alternates upserts and deletes by key.
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.beam_supertable.keyed_proc", uri, json.dumps(options),
         f"w{i}", str(rounds), str(KEYS), "1" if i == 3 else "0"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for i in range(4)]
    for p in procs:                          # all open the table, then start together
        assert p.stdout.readline().strip() == "READY", p.stderr.read()[-3000:]
    for p in procs:
        p.stdin.write("GO\n")
        p.stdin.flush()
    calls, retries = {}, 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        lines = out.splitlines()
        assert lines[-1] == "DONE", out
        retries += int(lines[-2].split()[1])
        for line in lines[:-2]:
            call = json.loads(line)
            calls[call["token"]] = call
    print(f"{len(calls)} calls, {retries} lost races re-resolved")
    assert retries > 0, "the writers never raced; the test proved nothing"
    table = Supertable.open(uri, storage_options=options)
    history = table.history()[1:]
    assert [h["version"] for h in history] == list(range(1, table.version + 1))
    landed = {h["token"]: h["version"] for h in history}
    assert all(calls[t]["op"] == "delete" for t in set(calls) - set(landed))  # matched nothing
    assert all(calls[t]["version"] == v for t, v in landed.items())
    # Replay the commits in version order on a dict; every version must match it.
    model = {}
    for h in history:
        call = calls[h["token"]]
        if call["op"] == "upsert":
            model.update({k: call["token"] for k in call["keys"]})
        else:
            for k in call["keys"]:
                model.pop(k, None)
        rows = table.checkout(h["version"]).to_arrow(columns=["id", "label"]).to_pylist()
        ids = [r["id"] for r in rows]
        assert len(ids) == len(set(ids)), f"two live rows for one key at version {h['version']}"
        assert {r["id"]: r["label"] for r in rows} == model, f"version {h['version']}"
    assert table.count_rows() == len(model)
    assert_every_version_reads_alike(uri, options)   # and so do Iceberg readers
