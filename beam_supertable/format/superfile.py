"""One object: valid Parquet for the rows, plus vector and text index sections.

Layout of a superfile::

    PAR1 | row groups (rows ordered by cell) | index sections | footer | PAR1

The sections sit between the last row group and the Parquet footer; any
Parquet reader ignores them. The footer's key-value metadata holds
``supertable.index``: JSON with the format version and, per section, its
``[offset, length]`` in the object.

The metadata has to be fixed when the writer opens (pyarrow before 17
cannot add key-value metadata later, and the Arrow schema stored in the
footer carries it too), but where the sections start is known only once the
row groups are encoded. So they are encoded once, and the footer is that of
a file of no rows opened with the final metadata, the row groups' metadata
appended: the bytes a writer opened with that metadata would have written.

``vector`` (when the table has a vector column)::

    dim, metric, rows
    cells: [[cell, row_start, row_count, fine_start, fine_count], ...]
    replicas: [[cell, rep_start, rep_count, fine_start, fine_count], ...]
    fine_centroids: float32 [n_fine, dim], little-endian, row-major
    sq8_params: float32 [2, dim] (lo, step)
    sq8: uint8 [rows + replica rows, dim]
    bits: uint8 [rows + replica rows, ceil(dim / 8)]
    replica_rows: int32 [replica rows], the row each replica entry points at

``text`` (when the table has FTS columns): the Arrow IPC streams of
:mod:`beam_supertable.fts.index`.

``keys`` (keyed tables, when the superfile has another section): the key
columns in row order, :func:`beam_supertable.format.keys.key_section`. The row
groups follow the cells, so a projected Parquet read of the key columns
takes one request per row group; the section takes one.

Index entries are ordered like the rows (cell, then fine cluster), followed
by the vector-only replica entries grouped by their second cell.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_supertable.format.keys import key_section
from beam_supertable.fts import index as fts_index
from beam_supertable.vector import codes
from beam_supertable.vector.metric import prepare, vectors_of

INDEX_KEY = b"supertable.index"
FORMAT = 1
FINE_RUN_BYTES = 2 << 20          # one fine IVF run: about 2 MiB of encoded rows
MIN_ROW_GROUP_ROWS = 256
MAX_ROW_GROUP_ROWS = 65_536


@dataclass(frozen=True)
class VectorSpec:
    column: str
    metric: str
    dim: int


def _fine_ivf(x: np.ndarray, encoded_row_bytes: int, seed: int = 0
              ) -> Tuple[np.ndarray, np.ndarray]:
    n_fine = max(1, math.ceil(len(x) * encoded_row_bytes / FINE_RUN_BYTES))
    if n_fine == 1 or len(x) <= n_fine:
        return x.mean(axis=0, keepdims=True).astype(np.float32), np.zeros(len(x), np.int64)
    from sklearn.cluster import KMeans  # (slow import: on use)

    km = KMeans(n_clusters=n_fine, n_init=1, max_iter=15, random_state=seed).fit(x)
    return km.cluster_centers_.astype(np.float32), km.labels_.astype(np.int64)


def _row_groups(boundaries: Sequence[int], total: int) -> List[Tuple[int, int]]:
    """Row-group spans cut at cell boundaries, each at least MIN_ROW_GROUP_ROWS."""
    spans, start = [], 0
    for b in list(boundaries) + [total]:
        if b - start >= MIN_ROW_GROUP_ROWS or (b == total and b > start):
            while b - start > MAX_ROW_GROUP_ROWS:
                spans.append((start, start + MAX_ROW_GROUP_ROWS))
                start += MAX_ROW_GROUP_ROWS
            if b > start:
                spans.append((start, b))
                start = b
    return spans


def build(table: pa.Table, *, vector: Optional[VectorSpec] = None,
          cells: Optional[np.ndarray] = None, replica_cells: Optional[np.ndarray] = None,
          fts_columns: Sequence[str] = (), analysis: Any = frozenset(),
          key_columns: Sequence[str] = ()) -> Tuple[bytes, Dict[str, Any]]:
    """Builds one superfile.

    Args:
        table: rows with ``_id`` and the user columns, in any order.
        vector: the vector column's spec; ``cells`` then gives each row's cell
            and ``replica_cells`` an optional second cell (-1 for none).
        fts_columns: the columns the text index holds, analyzed by
            ``analysis`` (the table's ``fts.analysis.Analyzer``).

    Returns:
        ``(object bytes, summary)``; the summary goes into the manifest entry.
    """
    header: Dict[str, Any] = {"format": FORMAT, "rows": table.num_rows}
    summary: Dict[str, Any] = {}
    boundaries: List[int] = []
    index_x = None
    if vector is not None:
        x = prepare(vectors_of(table, vector.column, vector.dim), vector.metric)
        # Rows are reordered by cell, then by fine cluster inside each cell;
        # the table itself is taken once, with the two orders composed.
        order = np.argsort(cells, kind="stable")
        x, cells = x[order], cells[order]
        if replica_cells is not None:
            replica_cells = replica_cells[order]
        dim = vector.dim
        row_bytes = dim + (dim + 7) // 8
        fine_centroids, cell_dir, perm = [], [], []
        fine_offset = 0
        uniq, starts = np.unique(cells, return_index=True)
        starts = list(starts) + [len(cells)]
        for i, cell in enumerate(uniq):
            s, e = starts[i], starts[i + 1]
            cent, labels = _fine_ivf(x[s:e], row_bytes)
            local = np.argsort(labels, kind="stable")
            perm.append(s + local)
            counts = np.bincount(labels, minlength=len(cent))
            cell_dir.append([int(cell), int(s), int(e - s), fine_offset, len(cent), counts.tolist()])
            fine_offset += len(cent)
            fine_centroids.append(cent)
            boundaries.append(int(s))
        perm = np.concatenate(perm) if perm else np.zeros(0, np.int64)
        table = table.take(pa.array(order[perm]))
        x, cells = x[perm], cells[perm]
        if replica_cells is not None:
            replica_cells = replica_cells[perm]
        centroids = np.concatenate(fine_centroids) if fine_centroids else np.zeros((0, dim), np.float32)
        fine_of_row = np.concatenate([
            np.repeat(np.arange(c[3], c[3] + c[4]), c[5]) for c in cell_dir]) if cell_dir else np.zeros(0, np.int64)
        # Vector-only replicas: rows posted again under their second cell.
        rep_rows = np.zeros(0, np.int64)
        rep_dir = []
        if replica_cells is not None and (replica_cells >= 0).any():
            rep_rows = np.where(replica_cells >= 0)[0]
            rep_rows = rep_rows[np.argsort(replica_cells[rep_rows], kind="stable")]
            rc = replica_cells[rep_rows]
            ru, rs = np.unique(rc, return_index=True)
            rs = list(rs) + [len(rc)]
            rep_fine = []
            for i, cell in enumerate(ru):
                s, e = rs[i], rs[i + 1]
                cent = x[rep_rows[s:e]].mean(axis=0, keepdims=True).astype(np.float32)
                rep_dir.append([int(cell), int(s), int(e - s), len(centroids) + len(rep_fine), 1])
                rep_fine.append(cent)
            centroids = np.concatenate([centroids] + rep_fine)
            fine_of_row = np.concatenate([fine_of_row, np.repeat(
                np.arange(len(centroids) - len(rep_fine), len(centroids)),
                [d[2] for d in rep_dir])])
        index_x = np.concatenate([x, x[rep_rows]]) if len(rep_rows) else x
        params = codes.sq8_params(index_x) if len(index_x) else np.zeros((2, dim), np.float32)
        sq8 = codes.sq8_encode(index_x, params)
        bits = codes.bits_encode(index_x - centroids[fine_of_row]) if len(index_x) else \
            np.zeros((0, (dim + 7) // 8), np.uint8)
        header["vector"] = {
            "column": vector.column, "dim": dim, "metric": vector.metric,
            "cells": [c[:5] for c in cell_dir],
            "fine_counts": [c[5] for c in cell_dir],
            "replicas": rep_dir,
        }
        vector_sections = {
            "fine_centroids": centroids.astype("<f4").tobytes(),
            "sq8_params": params.astype("<f4").tobytes(),
            "sq8": sq8.tobytes(),
            "bits": bits.tobytes(),
            "replica_rows": rep_rows.astype("<i4").tobytes(),
        }
        summary["cells"] = [int(c) for c in uniq]
        # Rows per cell, in the manifest: inspect and optimize size cells
        # without opening superfiles.
        summary["cell_rows"] = [int(c[2]) for c in cell_dir]
        summary["replica_cells"] = [d[0] for d in rep_dir]
    text_section = None
    if fts_columns:
        text_section, summary["text"] = fts_index.build(
            fts_index.row_texts(table, fts_columns), analysis)
    buf = io.BytesIO()
    # Float vectors barely compress; zstd on them costs time and slows reranks.
    compression = {f.name: ("none" if vector is not None and f.name == vector.column else "zstd")
                   for f in table.schema}
    # A dictionary never pays off for float vectors or the unique _id: trying
    # one per row group cost 4x the write time and left the vector pages 50 %
    # larger (a dictionary page plus indices); min/max of vector floats prune
    # nothing either.
    plain = {"_id"} | ({vector.column} if vector is not None else set())
    dictionary = [f.name for f in table.schema if f.name not in plain]
    statistics = [f.name for f in table.schema
                  if vector is None or f.name != vector.column]
    blobs = {f"vector.{name}": data for name, data in vector_sections.items()} \
        if vector is not None else {}
    if text_section is not None:
        blobs["text"] = text_section
    if key_columns and blobs:
        blobs["keys"] = key_section(table, key_columns)
    options = dict(compression=compression, use_dictionary=dictionary,
                   write_statistics=statistics)
    groups = _row_groups(boundaries[1:], table.num_rows)
    metadata = dict(table.schema.metadata or {})
    if not blobs:
        metadata[INDEX_KEY] = json.dumps(header, separators=(",", ":")).encode()
        buf = io.BytesIO()
        writer, _ = _write_row_groups(buf, table, table.schema.with_metadata(metadata), groups,
                                      options)
        writer.close()
        data = buf.getvalue()
    else:
        # The row groups are encoded once, without the header; the footer,
        # whose metadata names where the sections start, is made afterwards
        # (the row groups' bytes do not depend on the metadata).
        buf = io.BytesIO()
        writer, data_end = _write_row_groups(buf, table, table.schema, groups, options)
        writer.close()
        sections, offset = {}, data_end
        for name, blob in blobs.items():
            sections[name] = [offset, len(blob)]
            offset += len(blob)
        header["sections"] = sections
        metadata[INDEX_KEY] = json.dumps(header, separators=(",", ":")).encode()
        footer = _footer(pq.read_metadata(pa.BufferReader(pa.py_buffer(buf.getbuffer()))),
                         table.schema.with_metadata(metadata), options)
        data = b"".join([buf.getbuffer()[:data_end], *blobs.values(), footer])
        if "keys" in sections:
            summary["key_section"] = sections["keys"]
    summary["row_groups"] = len(groups)
    return data, summary


def _write_row_groups(sink, table: pa.Table, schema: pa.Schema, groups, options):
    """Opens a writer on ``sink`` and writes the row groups; returns it and where they end."""
    writer = pq.ParquetWriter(sink, schema, **options)
    for start, stop in groups or [(0, 0)]:
        writer.write_table(table.slice(start, stop - start))
    return writer, sink.tell()


def _footer(row_groups: pq.FileMetaData, schema: pa.Schema, options) -> bytes:
    """The footer (metadata, its length, ``PAR1``) a writer opened with ``schema`` would
    end a file holding ``row_groups`` with: the footer of a file of no rows, the row
    groups appended."""
    empty = pa.BufferOutputStream()
    pq.ParquetWriter(empty, schema, **options).close()
    metadata = pq.read_metadata(pa.BufferReader(empty.getvalue()))
    metadata.append_row_groups(row_groups)
    out = pa.BufferOutputStream()
    metadata.write_metadata_file(out)
    return out.getvalue().to_pybytes()[len(b"PAR1"):]


def read_header(metadata: pq.FileMetaData) -> Dict[str, Any]:
    kv = metadata.metadata or {}
    raw = kv.get(INDEX_KEY)
    return json.loads(raw) if raw else {"format": FORMAT, "sections": {}}
