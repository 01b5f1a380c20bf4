"""Reading a version's live rows by key, without scanning the table.

``UpsertToSupertable`` reads its prior back from the table (the feedback of
the upsert loop) only for the keys its commands touch. A lookup of ``u``
keys reads the manifest, then, per superfile whose key statistics (range and
bloom filter) may hold one of them, its key columns (the key section: one
ranged read, kept for the handle's life, as superfiles never change), and
finally only the matched rows (the row groups holding them).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import pyarrow as pa

from beam_supertable.errors import SchemaMismatchError
from beam_supertable.format.keys import KeyBatch, read_key_section
from beam_supertable.table.handle import TableHandle

__all__ = ["KeyLookup"]


class KeyLookup:
    """Finds the live rows of one table version by primary key.

    Args:
        table: a handle on the version to read (a keyed table).
    """

    def __init__(self, table: TableHandle) -> None:
        if not table.primary_key:
            raise SchemaMismatchError(f"{table.uri}: a key lookup needs a keyed table")
        self._table = table
        self._names = table.primary_key
        self._entries = table.superfiles()
        self._keys: Dict[str, pa.Table] = {}

    @property
    def table(self) -> TableHandle:
        return self._table

    def _key_columns(self, entry: dict) -> pa.Table:
        """A superfile's key columns, in row order (read once per handle)."""
        found = self._keys.get(entry["id"])
        if found is not None:
            return found
        section = entry["keys"].get("section") if entry.get("keys") else None
        if section is None:
            found = self._table._reader(entry).read(columns=self._names).select(self._names)
        else:
            offset, length = section
            data = self._table.store.get_range(entry["path"], offset, offset + length)
            self._table.io.add(len(data))
            found = read_key_section(data).select(self._names)
        self._keys[entry["id"]] = found
        return found

    def rows(self, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
        """The live rows whose key is in ``keys`` (key columns named as the table's).

        Args:
            keys: one row per key, unique keys, columns = the primary key.
            columns: the columns to return (include the key columns to tell
                the rows apart).

        Returns:
            At most one row per key, in no particular order.
        """
        batch = KeyBatch(keys, self._names)
        parts: List[pa.Table] = []
        for entry in self._entries:
            candidates = np.where(batch.may_hold(entry))[0]
            if len(candidates) == 0:
                continue
            rows, _ = batch.match(self._key_columns(entry), candidates)
            if len(rows) == 0:
                continue
            gone = self._table._deleted_rows(entry)
            if len(gone):
                rows = rows[~np.isin(rows, gone)]
            if len(rows):
                parts.append(self._table._reader(entry).take(rows, columns=list(columns)))
        if not parts:
            return pa.schema([self._table.schema.field(c) for c in columns]).empty_table()
        return pa.concat_tables(parts)
