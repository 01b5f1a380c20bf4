"""Real OS processes: one optimizing a keyed table while others upsert and delete."""

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


@pytest.fixture(params=[pytest.param(("local", 8, 12), id="local")] + [
    pytest.param((name, 3, 4), id=name, marks=pytest.mark.slow) for name in REMOTE_BACKENDS])
def location(request, tmp_path):
    backend, *sizes = request.param
    return (*backend_location(request, backend, tmp_path), *sizes)


def _start(args):
    return subprocess.Popen([sys.executable, "-m"] + args, cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_optimize_racing_upserts_and_deletes_loses_and_resurrects_nothing(location):
    uri, options, rounds, optimizes = location
    table = Supertable.create(uri, SCHEMA, primary_key="id", storage_options=options)
    table.append(pa.table({"id": pa.array(range(KEYS), pa.int64()), "label": ["seed"] * KEYS}),
                 token="seed")
    writers = [_start(["tests.beam_supertable.keyed_proc", uri, json.dumps(options), f"w{i}",
                       str(rounds), str(KEYS), "1" if i == 1 else "0"]) for i in range(2)]
    optimizer = _start(["tests.beam_supertable.optimize_proc", uri, json.dumps(options),
                        str(optimizes)])
    procs = writers + [optimizer]
    for p in procs:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()[-3000:]
    for p in procs:
        p.stdin.write("GO\n")
        p.stdin.flush()
    calls = {}
    for p in writers:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        for line in out.splitlines()[:-2]:
            call = json.loads(line)
            calls[call["token"]] = call
    out, err = optimizer.communicate(timeout=600)
    assert optimizer.returncode == 0, err[-3000:]
    lines = out.splitlines()
    optimized = [json.loads(line)["version"] for line in lines[:-2]]
    print(f"{len(calls)} writes, {optimized.count(None)} idle optimizes, {lines[-2]}")
    assert int(lines[-2].split()[1]) > 0, "the optimizer never raced a writer; proved nothing"
    table = Supertable.open(uri, storage_options=options)
    history = table.history()
    ops = [h["operation"] for h in history]
    assert ops.count("optimize") == len([v for v in optimized if v is not None]) >= 2
    # Between writes the optimizes landed: replay every version on a dict.
    model = {k: "seed" for k in range(KEYS)}
    ids = None
    for h in history[2:]:
        rows = table.checkout(h["version"]).to_arrow(columns=["_id", "id", "label"]).to_pylist()
        if h["operation"] == "optimize":
            # Same rows, same _ids: an optimize changes nothing a reader sees.
            assert {r["id"]: r["_id"] for r in rows} == ids, f"version {h['version']}"
        else:
            call = calls[h["token"]]
            if call["op"] == "upsert":
                model.update({k: call["token"] for k in call["keys"]})
            else:
                for k in call["keys"]:
                    model.pop(k, None)
        keys = [r["id"] for r in rows]
        assert len(keys) == len(set(keys)), f"two live rows for one key at version {h['version']}"
        assert {r["id"]: r["label"] for r in rows} == model, f"version {h['version']}"
        ids = {r["id"]: r["_id"] for r in rows}
    assert table.count_rows() == len(model)
    assert_every_version_reads_alike(uri, options)   # and so do Iceberg readers
