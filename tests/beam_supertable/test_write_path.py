"""The one write path: ``write_superfiles`` then ``commit_superfiles``, for every writer.

``append``, ``upsert``, ``delete`` and the Beam sink all commit through
``Supertable.commit_superfiles``: on each base the commit loop tries, the
superfiles are put on the base's grid (rebuilt with the same ``_id`` s when
another writer stamped its grid first) and the mutation is resolved.
"""

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from beam_supertable import Supertable, WriteToSupertable
from beam_supertable.table.mutation import Mutation
from tests.beam_supertable.test_table import SCHEMA, _data, _recall

KEYED = pa.schema([("id", pa.int64()), ("emb", pa.list_(pa.float32(), 16))])


def _ids(table):
    return sorted(table.to_arrow(columns=["_id"])["_id"].to_pylist())


def test_superfiles_built_on_a_grid_that_lost_are_rebuilt_keeping_their_ids(table_location):
    uri, options = table_location
    Supertable.create(uri, SCHEMA, vector_column="emb", storage_options=options)
    a, b = (Supertable.open(uri, storage_options=options) for _ in range(2))
    data, x = _data(3000, seed=7)
    first, first_stamp = a.write_superfiles(data.slice(0, 1500), n_shards=2)
    second, second_stamp = b.write_superfiles(data.slice(1500), n_shards=3)
    assert first_stamp["grid"]["sha256"] != second_stamp["grid"]["sha256"]  # two grids trained
    a.commit_superfiles(first, grids=first_stamp.values())
    version = b.commit_superfiles(second, grids=second_stamp.values())
    t = Supertable.open(uri, storage_options=options)
    assert version == t.version == 2 and t.count_rows() == 3000
    assert t.properties["grid"] == first_stamp["grid"]
    assert {e["grid"] for e in t.superfiles()} == {first_stamp["grid"]["sha256"]}
    # The loser's rows were rebuilt on the winner's grid under the ids they were built with.
    live = set(_ids(t))       # once: read inside the loop it cost a table scan per id
    built = sorted(i for e in second for i in range(e["id_min"], e["id_max"] + 1)
                   if i in live)
    assert len(built) == 1500
    assert {e["id"] for e in second}.isdisjoint({e["id"] for e in t.superfiles()})
    assert _recall(t, x, x[1500:1520] + 0.05) >= 0.9


def test_one_commit_of_shards_built_on_several_new_grids_stamps_one(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb")
    handles = [Supertable.open(uri) for _ in range(3)]
    data, x = _data(1800, seed=3)
    entries, grids = [], []
    for i, h in enumerate(handles):
        built, stamp = h.write_superfiles(data.slice(600 * i, 600))
        entries += built
        grids += stamp.values()
    t = Supertable.open(uri)
    t.commit_superfiles(entries, Mutation(t, "write", token="one"), grids=grids)
    least = min(g["sha256"] for g in grids)
    assert t.properties["grid"]["sha256"] == least
    assert {e["grid"] for e in t.superfiles()} == {least} and t.count_rows() == 1800
    assert _recall(t, x, x[:20] + 0.05) >= 0.9


def test_a_beam_write_and_an_append_racing_for_the_first_grid_agree(tmp_path):
    uri = str(tmp_path / "t")
    Supertable.create(uri, SCHEMA, vector_column="emb", fts_columns=["body"])
    stale = Supertable.open(uri)               # will train its own grid
    data, x = _data(4000, seed=11)
    p = TestPipeline()
    _ = p | beam.Create(data.slice(0, 2000).to_pylist(), reshuffle=False) | WriteToSupertable(uri)
    p.run().wait_until_finish()
    stale.append(data.slice(2000))
    t = Supertable.open(uri)
    assert t.count_rows() == 4000 and len({e["grid"] for e in t.superfiles()}) == 1
    assert [h["operation"] for h in t.history()] == ["create", "write", "append"]
    assert _recall(t, x, x[::200] + 0.05) >= 0.9
    assert t.search(text="doc 7 beta", k=1).num_rows == 1


@pytest.mark.parametrize("operation", ["append", "upsert"])
def test_a_keyed_write_that_loses_the_grid_race_still_resolves_its_keys(tmp_path, operation):
    uri = str(tmp_path / "t")
    Supertable.create(uri, KEYED, vector_column="emb", primary_key="id")
    stale = Supertable.open(uri)
    rng = np.random.default_rng(5)

    def rows(ids):
        x = rng.normal(size=(len(ids), 16)).astype(np.float32)
        return pa.table({"id": ids, "emb": pa.FixedSizeListArray.from_arrays(
            pa.array(x.ravel()), 16)}, schema=KEYED)

    Supertable.open(uri).append(rows(list(range(0, 300))))     # stamps the grid first
    if operation == "append":
        stale.append(rows(list(range(300, 600))))
    else:
        stale.upsert(rows(list(range(200, 600))))               # replaces 200..299
    t = Supertable.open(uri)
    live = t.to_arrow(columns=["id"])["id"].to_pylist()
    assert sorted(live) == list(range(600))                      # one live row per key
    assert len({e["grid"] for e in t.superfiles()}) == 1
    assert t.count_rows(filter=pc.field("id") < 300) == 300
