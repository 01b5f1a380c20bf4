"""Iceberg v2 manifests and manifest lists, as the spec's Avro schemas, with fastavro.

Every file is a function of its content: the Avro sync marker is derived from
the file's name, so two writers that build the same file write the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional

import fastavro

__all__ = ["DATA", "DELETES", "manifest_bytes", "manifest_list_bytes", "read_manifest_list",
           "read_manifest"]

DATA, DELETES = 0, 1              # manifest content, and data_file.content for data files
POSITION_DELETES = 1              # data_file.content of a position delete file
ADDED = 1                         # manifest_entry.status


def _optional(kind: Any) -> List[Any]:
    return ["null", kind]


def _int_map(name: str, key_id: int, value_id: int, value: str) -> Dict[str, Any]:
    """An Iceberg map with int keys: an Avro array of key/value records."""
    return {"type": "array", "logicalType": "map", "items": {
        "type": "record", "name": f"k{key_id}_v{value_id}", "fields": [
            {"name": "key", "type": "int", "field-id": key_id},
            {"name": "value", "type": value, "field-id": value_id}]}}


_DATA_FILE = {
    "type": "record", "name": "r2", "fields": [
        {"name": "content", "type": "int", "field-id": 134},
        {"name": "file_path", "type": "string", "field-id": 100},
        {"name": "file_format", "type": "string", "field-id": 101},
        {"name": "partition", "type": {"type": "record", "name": "r102", "fields": []},
         "field-id": 102},
        {"name": "record_count", "type": "long", "field-id": 103},
        {"name": "file_size_in_bytes", "type": "long", "field-id": 104},
        {"name": "column_sizes", "type": _optional(_int_map("column_sizes", 117, 118, "long")),
         "default": None, "field-id": 108},
        {"name": "value_counts", "type": _optional(_int_map("value_counts", 119, 120, "long")),
         "default": None, "field-id": 109},
        {"name": "null_value_counts",
         "type": _optional(_int_map("null_value_counts", 121, 122, "long")),
         "default": None, "field-id": 110},
        {"name": "nan_value_counts",
         "type": _optional(_int_map("nan_value_counts", 138, 139, "long")),
         "default": None, "field-id": 137},
        {"name": "lower_bounds", "type": _optional(_int_map("lower_bounds", 126, 127, "bytes")),
         "default": None, "field-id": 125},
        {"name": "upper_bounds", "type": _optional(_int_map("upper_bounds", 129, 130, "bytes")),
         "default": None, "field-id": 128},
        {"name": "key_metadata", "type": _optional("bytes"), "default": None, "field-id": 131},
        {"name": "split_offsets",
         "type": _optional({"type": "array", "items": "long", "element-id": 133}),
         "default": None, "field-id": 132},
        {"name": "equality_ids",
         "type": _optional({"type": "array", "items": "int", "element-id": 136}),
         "default": None, "field-id": 135},
        {"name": "sort_order_id", "type": _optional("int"), "default": None, "field-id": 140},
    ]}

MANIFEST_ENTRY = fastavro.parse_schema({
    "type": "record", "name": "manifest_entry", "fields": [
        {"name": "status", "type": "int", "field-id": 0},
        {"name": "snapshot_id", "type": _optional("long"), "default": None, "field-id": 1},
        {"name": "sequence_number", "type": _optional("long"), "default": None, "field-id": 3},
        {"name": "file_sequence_number", "type": _optional("long"), "default": None,
         "field-id": 4},
        {"name": "data_file", "type": _DATA_FILE, "field-id": 2},
    ]})

# manifest_file's required fields: (name, type, field id), in the spec's order.
_MANIFEST_FILE_FIELDS = (
    ("manifest_path", "string", 500), ("manifest_length", "long", 501),
    ("partition_spec_id", "int", 502), ("content", "int", 517),
    ("sequence_number", "long", 515), ("min_sequence_number", "long", 516),
    ("added_snapshot_id", "long", 503), ("added_files_count", "int", 504),
    ("existing_files_count", "int", 505), ("deleted_files_count", "int", 506),
    ("added_rows_count", "long", 512), ("existing_rows_count", "long", 513),
    ("deleted_rows_count", "long", 514))

MANIFEST_FILE = fastavro.parse_schema({
    "type": "record", "name": "manifest_file", "fields": [
        *({"name": name, "type": kind, "field-id": field_id}
          for name, kind, field_id in _MANIFEST_FILE_FIELDS),
        {"name": "partitions", "type": _optional({
            "type": "array", "element-id": 508, "items": {
                "type": "record", "name": "r508", "fields": [
                    {"name": "contains_null", "type": "boolean", "field-id": 509},
                    {"name": "contains_nan", "type": _optional("boolean"), "default": None,
                     "field-id": 518},
                    {"name": "lower_bound", "type": _optional("bytes"), "default": None,
                     "field-id": 510},
                    {"name": "upper_bound", "type": _optional("bytes"), "default": None,
                     "field-id": 511}]}}),
         "default": None, "field-id": 507},
        {"name": "key_metadata", "type": _optional("bytes"), "default": None, "field-id": 519},
    ]})


def _avro(name: str, schema: Any, records: Iterable[Mapping[str, Any]],
          metadata: Mapping[str, str]) -> bytes:
    out = io.BytesIO()
    sync = hashlib.sha256(name.encode()).digest()[:16]
    fastavro.writer(out, schema, list(records), metadata=dict(metadata), sync_marker=sync,
                    codec="null")
    return out.getvalue()


def _pairs(mapping: Optional[Mapping[int, Any]]) -> Optional[List[Dict[str, Any]]]:
    if not mapping:
        return None
    return [{"key": int(k), "value": v} for k, v in sorted(mapping.items())]


def data_file(*, content: int, path: str, records: int, size: int,
              value_counts: Optional[Mapping[int, int]] = None,
              null_counts: Optional[Mapping[int, int]] = None,
              lower: Optional[Mapping[int, bytes]] = None,
              upper: Optional[Mapping[int, bytes]] = None) -> Dict[str, Any]:
    """One ``data_file`` record (a data file, or a position delete file)."""
    return {"content": content, "file_path": path, "file_format": "PARQUET", "partition": {},
            "record_count": int(records), "file_size_in_bytes": int(size),
            "column_sizes": None, "value_counts": _pairs(value_counts),
            "null_value_counts": _pairs(null_counts), "nan_value_counts": None,
            "lower_bounds": _pairs(lower), "upper_bounds": _pairs(upper),
            "key_metadata": None, "split_offsets": None, "equality_ids": None,
            "sort_order_id": None}


def manifest_bytes(name: str, files: List[Dict[str, Any]], *, content: int, snapshot_id: int,
                   schema_json: Dict[str, Any]) -> bytes:
    """A manifest of ``files``, all ADDED by ``snapshot_id``.

    Data files carry data sequence number 0: a position delete applies to a
    data file whose sequence number is not greater than its own, and every
    deletion vector was written after the superfile it names, whatever
    manifest (a merged part's, say) lists that superfile later.
    """
    entries = [{"status": ADDED, "snapshot_id": snapshot_id,
                "sequence_number": 0 if content == DATA else None,
                "file_sequence_number": 0 if content == DATA else None,
                "data_file": f} for f in files]
    metadata = {"schema": json.dumps(schema_json, separators=(",", ":")), "schema-id": "0",
                "partition-spec": "[]", "partition-spec-id": "0", "format-version": "2",
                "content": "data" if content == DATA else "deletes"}
    return _avro(name, MANIFEST_ENTRY, entries, metadata)


def manifest_list_entry(path: str, length: int, *, content: int, sequence_number: int,
                        snapshot_id: int, files: int, rows: int) -> Dict[str, Any]:
    return {"manifest_path": path, "manifest_length": int(length), "partition_spec_id": 0,
            "content": content, "sequence_number": sequence_number,
            "min_sequence_number": 0 if content == DATA else sequence_number,
            "added_snapshot_id": snapshot_id, "added_files_count": int(files),
            "existing_files_count": 0, "deleted_files_count": 0,
            "added_rows_count": int(rows), "existing_rows_count": 0, "deleted_rows_count": 0,
            "partitions": None, "key_metadata": None}


def manifest_list_bytes(name: str, entries: List[Dict[str, Any]], *, snapshot_id: int,
                        sequence_number: int) -> bytes:
    metadata = {"snapshot-id": str(snapshot_id), "sequence-number": str(sequence_number),
                "format-version": "2"}
    return _avro(name, MANIFEST_FILE, entries, metadata)


def read_manifest_list(data: bytes) -> List[Dict[str, Any]]:
    return list(fastavro.reader(io.BytesIO(data)))


def read_manifest(data: bytes) -> List[Dict[str, Any]]:
    return list(fastavro.reader(io.BytesIO(data)))
