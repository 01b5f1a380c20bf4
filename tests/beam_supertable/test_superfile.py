"""The superfile: valid Parquet for any reader, index sections behind offsets."""

import base64
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable import Supertable
from beam_supertable.format.superfile import INDEX_KEY


def _table(n=3000, d=8, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(12, d)) * 4)[rng.integers(0, 12, n)] + rng.normal(size=(n, d))
    return pa.table({
        "n": np.arange(n),
        "body": [f"row {i} says {'even' if i % 2 == 0 else 'odd'}" for i in range(n)],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.astype(np.float32).ravel()), d),
    }), x.astype(np.float32)


def test_superfile_is_plain_parquet_with_index_offsets(tmp_path):
    data, x = _table()
    t = Supertable.create(str(tmp_path / "t"), data.schema, vector_column="emb",
                          fts_columns=["body"], n_cells=16)
    t.append(data)
    entry = t.superfiles()[0]
    raw = (tmp_path / "t" / entry["path"]).read_bytes()
    read = pq.read_table(io.BytesIO(raw))          # any Parquet reader opens it
    assert read.column_names == ["_id", "n", "body", "emb"]
    assert sorted(read["n"].to_pylist()) == list(range(3000))
    header = json.loads(pq.ParquetFile(io.BytesIO(raw)).metadata.metadata[INDEX_KEY])
    footer_start = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    # Sections are [offset, length] in the object: back to back after the
    # row groups, the last one ending where the footer starts.
    spans = sorted(header["sections"].values())
    assert spans[-1][0] + spans[-1][1] == footer_start
    assert all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:]))
    meta = pq.ParquetFile(io.BytesIO(raw)).metadata
    chunks = [meta.row_group(i).column(j)
              for i in range(meta.num_row_groups) for j in range(meta.num_columns)]
    data_end = max((c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset)
                   + c.total_compressed_size for c in chunks)
    assert 4 <= data_end <= spans[0][0]
    fine = header["sections"]["vector.fine_centroids"]
    centroids = np.frombuffer(raw[fine[0]:fine[0] + fine[1]], dtype="<f4")
    assert fine[1] > 0 and np.isfinite(centroids).all()
    # Rows are ordered by cell: each cell's rows are one contiguous run.
    cells = header["vector"]["cells"]
    starts = [c[1] for c in cells]
    assert starts == sorted(starts) and sum(c[2] for c in cells) == 3000
    assert sorted(c[0] for c in cells) == sorted(entry["cells"])



def test_superfile_bytes_are_those_of_one_writer_opened_with_the_header(tmp_path):
    # The row groups are encoded once and the footer made afterwards: the
    # object must be byte for byte what a writer opened with the final
    # metadata writes, sections between the row groups and the footer.
    data, _ = _table()
    keys = pa.table({"k": [f"k{i}" for i in range(3000)], **{n: data[n] for n in data.column_names}})
    for table, kwargs in ((data, {}), (keys, {"primary_key": ["k"]})):
        t = Supertable.create(str(tmp_path / f"t{len(kwargs)}"), table.schema,
                              vector_column="emb", fts_columns=["body"], n_cells=16,
                              replica_factor=0.1, **kwargs)
        t.append(table)
        raw = (tmp_path / f"t{len(kwargs)}" / t.superfiles()[0]["path"]).read_bytes()
        f = pq.ParquetFile(io.BytesIO(raw))
        header = json.loads(f.metadata.metadata[INDEX_KEY])
        stored = f.read()
        # The Arrow schema the writer was opened with, header included.
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(
            f.metadata.metadata[b"ARROW:schema"])))
        assert schema.metadata[INDEX_KEY] == f.metadata.metadata[INDEX_KEY]
        options = dict(compression={n: "none" if n == "emb" else "zstd" for n in stored.column_names},
                       use_dictionary=[n for n in stored.column_names if n not in ("_id", "emb")],
                       write_statistics=[n for n in stored.column_names if n != "emb"])
        again = io.BytesIO()
        writer = pq.ParquetWriter(again, schema, **options)
        for i in range(f.metadata.num_row_groups):
            writer.write_table(f.read_row_group(i).cast(schema))
        for start, length in sorted(header["sections"].values()):
            again.write(raw[start:start + length])
        writer.close()
        assert again.getvalue() == raw

def test_search_touches_a_small_part_of_the_object(tmp_path):
    data, x = _table(n=20000, d=32)
    t = Supertable.create(str(tmp_path / "t"), data.schema, vector_column="emb", n_cells=64)
    t.append(data)
    t = Supertable.open(str(tmp_path / "t"))
    t.search(vector=x[0], k=10)
    size = sum(e["bytes"] for e in t.superfiles())
    touched = t.io.snapshot()["bytes"]
    assert touched < 0.35 * size, (touched, size)
