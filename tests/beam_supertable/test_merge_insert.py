"""``merge_insert``: each clause alone and together against a plain-Python
model, on keyed and key-less tables; the indexes and the change feed after a
merge; refusals; real processes merging into one keyed table at once."""

import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_supertable import DuplicateKeyError, MergeResult, SchemaMismatchError, Supertable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("ts", pa.int64())])
NEWER = pc.field("source.ts") > pc.field("target.ts")
BIG = pc.field("v") > 5


def _uri():
    return f"memory://merge/{uuid.uuid4().hex}"


def model(target, source, update, update_where, insert, delete, delete_where):
    """What the merge leaves, and its counts, on plain tuples (k, v, ts)."""
    by_key = {}
    for i, s in enumerate(source):
        if s[0] is not None:
            by_key[s[0]] = i
    out, matched, n_upd, n_del = [], set(), 0, 0
    for t in target:
        i = by_key.get(t[0]) if t[0] is not None else None
        if i is not None:
            matched.add(i)
            s = source[i]
            if update and (not update_where or s[2] > t[2]):
                out.append(s)
                n_upd += 1
            else:
                out.append(t)
        elif delete and (not delete_where or t[1] > 5):
            n_del += 1
        else:
            out.append(t)
    n_ins = 0
    for i, s in enumerate(source):
        if i not in matched and insert:
            out.append(s)
            n_ins += 1
    return sorted(out, key=repr), (n_ins, n_upd, n_del)


def rows_of(table):
    return sorted(((r["k"], r["v"], r["ts"]) for r in table.to_arrow(
        columns=["k", "v", "ts"]).to_pylist()), key=repr)


def as_table(rows):
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                     "v": pa.array([r[1] for r in rows], pa.int64()),
                     "ts": pa.array([r[2] for r in rows], pa.int64())})


def row(keys):
    return st.tuples(keys, st.integers(0, 9), st.integers(0, 3))


clauses = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.booleans()
                    ).filter(lambda c: c[0] or c[2] or c[3])


def _run(t, source, c):
    b = t.merge_insert(None if t.primary_key else "k")
    if c[0]:
        b = b.when_matched_update_all(where=NEWER if c[1] else None)
    if c[2]:
        b = b.when_not_matched_insert_all()
    if c[3]:
        b = b.when_not_matched_by_source_delete(where=BIG if c[4] else None)
    return b.execute(as_table(source))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.lists(row(st.integers(0, 7)), max_size=8, unique_by=lambda r: r[0]),
       source=st.lists(row(st.integers(0, 9)), max_size=6, unique_by=lambda r: r[0]),
       split=st.integers(0, 8), c=clauses)
def test_keyed_merge_insert_equals_the_model(target, source, split, c):
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    for part in (target[:split], target[split:]):   # two superfiles
        if part:
            t.append(as_table(part))
    before = t.version
    want, counts = model(target, source, c[0], c[1], c[2], c[3], c[4])
    result = _run(t, source, c)
    assert isinstance(result, MergeResult)
    assert rows_of(t) == want
    assert (result.num_inserted_rows, result.num_updated_rows, result.num_deleted_rows) == counts
    # One commit, none when nothing changes.
    assert result.version == t.version == before + (1 if any(counts) else 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.lists(row(st.one_of(st.none(), st.integers(0, 4))), max_size=8),
       source=st.lists(row(st.one_of(st.none(), st.integers(0, 6))), max_size=6,
                       unique_by=lambda r: r[0] if r[0] is not None else object()),
       c=clauses)
def test_keyless_merge_insert_equals_the_model(target, source, c):
    # Key-less: the target may hold a key several times (each matched row is
    # replaced) and nulls, which match nothing.
    t = Supertable.create(_uri(), SCHEMA)
    if target:
        t.append(as_table(target))
    want, counts = model(target, source, c[0], c[1], c[2], c[3], c[4])
    result = _run(t, source, c)
    assert rows_of(t) == want
    assert (result.num_inserted_rows, result.num_updated_rows, result.num_deleted_rows) == counts


def test_the_change_feed_shows_an_update_as_a_retraction_and_an_insertion():
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    t.append(as_table([(1, 1, 0), (2, 2, 0), (3, 3, 0)]))
    start = t.version
    r = (t.merge_insert().when_matched_update_all(where=NEWER).when_not_matched_insert_all()
         .when_not_matched_by_source_delete().execute(as_table([(1, 10, 1), (2, 20, 0),
                                                                 (4, 40, 0)])))
    assert (r.num_inserted_rows, r.num_updated_rows, r.num_deleted_rows) == (1, 1, 1)
    feed = t.changes(start).to_pylist()
    got = sorted((c["_change"], c["k"], c["v"]) for c in feed)
    assert got == [(-1, 1, 1), (-1, 3, 3), (1, 1, 10), (1, 4, 40)]
    assert {c["_version"] for c in feed} == {r.version}


def test_the_vector_and_text_indexes_follow_a_merge():
    schema = pa.schema([("k", pa.int64()), ("body", pa.string()),
                        ("emb", pa.list_(pa.float32(), 2))])
    t = Supertable.create(_uri(), schema, primary_key="k", vector_column="emb",
                          fts_columns=["body"])
    t.append(pa.table({"k": [1, 2], "body": ["a cat", "a dog"],
                       "emb": [[1.0, 0.0], [0.0, 1.0]]}))
    (t.merge_insert().when_matched_update_all().when_not_matched_by_source_delete()
     .execute(pa.table({"k": [1], "body": ["a bird"], "emb": [[0.0, -1.0]]})))
    assert t.search(vector=[0.0, -1.0], k=5, columns=["k", "body"]).column("body").to_pylist() \
        == ["a bird"]
    assert t.search(text="cat", k=5).num_rows == 0
    assert t.search(text="dog", k=5).num_rows == 0
    assert t.search(text="bird", k=5).column("k").to_pylist() == [1]


def test_upsert_is_the_builders_common_case_and_counts():
    t = Supertable.create(_uri(), SCHEMA, primary_key="k")
    t.upsert(as_table([(1, 1, 0), (2, 2, 0)]))
    r = (t.merge_insert().when_matched_update_all().when_not_matched_insert_all()
         .execute(as_table([(2, 5, 0), (3, 3, 0)])))
    assert (r.num_inserted_rows, r.num_updated_rows, r.num_deleted_rows) == (1, 1, 0)
    assert r.version == t.version
    assert rows_of(t) == [(1, 1, 0), (2, 5, 0), (3, 3, 0)]


def test_refusals_name_what_is_wrong_and_commit_nothing():
    keyed = Supertable.create(_uri(), SCHEMA, primary_key="k")
    keyed.append(as_table([(1, 1, 0)]))
    keyless = Supertable.create(_uri(), SCHEMA)
    with pytest.raises(SchemaMismatchError, match="needs on="):
        keyless.merge_insert()
    with pytest.raises(SchemaMismatchError, match="'nope'"):
        keyless.merge_insert("nope")
    with pytest.raises(SchemaMismatchError, match=r"primary key \['k'\]"):
        keyed.merge_insert("v")
    with pytest.raises(DuplicateKeyError, match="k=2 appears 2 times"):
        (keyed.merge_insert().when_matched_update_all(where=NEWER)
         .execute(as_table([(2, 1, 0), (2, 2, 0)])))
    with pytest.raises(SchemaMismatchError, match="source.nope"):
        (keyed.merge_insert().when_matched_update_all(where=pc.field("source.nope") > 1)
         .execute(as_table([(1, 1, 0)])))
    with pytest.raises(TypeError, match="pyarrow expression"):
        keyed.merge_insert().when_matched_update_all(where="source.ts > target.ts")
    with pytest.raises(ValueError, match="no clause"):
        keyed.merge_insert().execute(as_table([(1, 1, 0)]))
    assert keyed.refresh().version == 1 and rows_of(keyed) == [(1, 1, 0)]


def test_on_a_vector_or_struct_column_is_refused_naming_it():
    schema = pa.schema([("g", pa.int64()), ("emb", pa.list_(pa.float32(), 2)),
                        ("m", pa.struct([("a", pa.int64())]))])
    t = Supertable.create(_uri(), schema, vector_column="emb")
    for column in ("emb", "m"):
        with pytest.raises(SchemaMismatchError, match=f"column '{column}' is"):
            t.merge_insert(column)


def test_racing_merges_lose_nothing(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, primary_key="k")
    rounds, n_keys = 6, 12
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.beam_supertable.merge_proc", uri, f"w{i}", str(rounds),
         str(n_keys), "1" if i == 2 else "0"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for i in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()[-3000:]
    for p in procs:
        p.stdin.write("GO\n")
        p.stdin.flush()
    calls, retries, replans = {}, 0, 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        lines = out.splitlines()
        assert lines[-1] == "DONE", out
        retries += int(lines[-2].split()[1])
        replans += int(lines[-3].split()[1])
        for line in lines[:-3]:
            call = json.loads(line)
            calls[call["token"]] = call
    print(f"{retries} lost races, {replans} merges re-planned")
    assert retries > 0, "the writers never raced; the test proved nothing"
    table = Supertable.open(uri)
    history = table.history()[1:]
    landed = {h["token"]: h["version"] for h in history}
    assert all(not any(calls[t]["counts"]) for t in set(calls) - set(landed))
    # Replay the commits in version order on the model; every version must match it.
    state = []
    for h in history:
        call = calls[h["token"]]
        source = [tuple(r) for r in call["rows"]]
        state, counts = model(state, source, True, True, True, call["delete"], True)
        assert list(counts) == call["counts"], h["version"]
        assert rows_of(table.checkout(h["version"])) == state, f"version {h['version']}"
    assert len({r[0] for r in state}) == len(state)
    assert np.all(np.diff([h["version"] for h in history]) == 1)
