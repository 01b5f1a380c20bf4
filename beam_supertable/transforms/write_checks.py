"""``WriteToSupertable``'s argument checks, made while the pipeline is built."""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional

import numpy as np
import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.table.supertable import Supertable

Metric = Literal["l2", "cosine", "dot"]
METRICS = ("l2", "cosine", "dot")
OnInvalid = Literal["dead_letter", "fail"]
ON_INVALID = ("dead_letter", "fail")


def _refuse_keyed(table: Supertable) -> None:
    """The sink appends without key checks: on a keyed table that could make
    two live rows of one key, so it is refused (``UpsertToSupertable`` writes
    keyed tables)."""
    if table.primary_key:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {table.uri!r} is keyed (primary key "
            f"{table.primary_key}); the sink appends without key checks, which could leave "
            f"two live rows of one key. Write keyed tables with UpsertToSupertable, or "
            f"Supertable.upsert/append")


def _check_existing(table: Supertable, schema: Optional[pa.Schema],
                    given: Dict[str, Any]) -> None:
    """Settings given to ``WriteToSupertable`` must match the existing ``table``'s."""
    uri = table.uri
    _refuse_keyed(table)
    if schema is not None and not schema.equals(table.user_schema):
        raise SchemaMismatchError(
            f"WriteToSupertable: schema does not match the table at {uri!r}.\n"
            f"received:\n{schema}\nthe table has:\n{table.user_schema}")
    vp = table.properties.get("vector") or {}
    fp = table.properties.get("fts") or {}
    held = {"vector_column": vp.get("column"), "metric": vp.get("metric"),
            "fts_columns": tuple(fp.get("columns", ())), "n_cells": vp.get("n_cells"),
            "replica_factor": vp.get("replica_factor", 0.0)}
    if given["vector_column"] is not None and given["vector_column"] != held["vector_column"]:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {uri!r} indexes "
            f"{held['vector_column'] or 'no'} vector column, not {given['vector_column']!r}")
    differ = [f"{name}={value!r} (the table has {held[name]!r})"
              for name, value in given.items() if value is not None and value != held[name]]
    if differ:
        raise SchemaMismatchError(
            f"WriteToSupertable: the table at {uri!r} was created with other settings: "
            f"{', '.join(differ)}; these settings apply only when the table is created")


def _positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _check_arguments(*, uri, schema, vector_column, metric, fts_columns, n_cells, n_shards,
                     storage_options, on_invalid, commit_every, job_id, replica_factor,
                     batch_rows, grid_sample_rows) -> None:
    """``WriteToSupertable``'s arguments, each checked on its own (nothing is read)."""
    def bad(name: str, want: str, got) -> ValueError:
        return ValueError(f"WriteToSupertable: {name} must be {want}, got {got!r}")

    if not isinstance(uri, str) or not uri:
        raise TypeError(f"WriteToSupertable: uri must be a non-empty str, got {uri!r}")
    if schema is not None and not isinstance(schema, pa.Schema):
        raise TypeError(f"WriteToSupertable: schema must be a pyarrow.Schema or None, "
                        f"got {type(schema).__name__}")
    if vector_column is not None and not isinstance(vector_column, str):
        raise TypeError(f"WriteToSupertable: vector_column must be a str or None, "
                        f"got {vector_column!r}")
    if fts_columns is not None and (isinstance(fts_columns, str) or
                                    not all(isinstance(c, str) for c in fts_columns)):
        raise TypeError(f"WriteToSupertable: fts_columns must be a list of column names, "
                        f"got {fts_columns!r}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"WriteToSupertable: storage_options must be a dict or None, "
                        f"got {type(storage_options).__name__}")
    if on_invalid not in ON_INVALID:
        raise bad("on_invalid", f"one of {ON_INVALID}", on_invalid)
    if metric is not None and metric not in METRICS:
        raise bad("metric", f"one of {METRICS}", metric)
    for name, value in (("n_shards", n_shards), ("n_cells", n_cells)):
        if value is not None and not _positive_int(value):
            raise bad(name, "a positive int", value)
    for name, value in (("batch_rows", batch_rows), ("grid_sample_rows", grid_sample_rows)):
        if not _positive_int(value):
            raise bad(name, "a positive int", value)
    if isinstance(commit_every, bool) or not isinstance(commit_every, (int, float)) \
            or commit_every <= 0:
        raise bad("commit_every", "> 0 seconds", commit_every)
    if replica_factor is not None and (isinstance(replica_factor, bool) or not isinstance(
            replica_factor, (int, float)) or not 0 <= replica_factor <= 1):
        raise bad("replica_factor", "a share between 0 and 1", replica_factor)
    if job_id is not None and (not isinstance(job_id, str) or not job_id):
        raise bad("job_id", "a non-empty str", job_id)
