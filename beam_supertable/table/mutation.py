"""Every write's commit request, resolved against the version it commits on.

Every write builds its ``CommitRequest`` here (``Supertable.commit_superfiles``:
``append``, ``upsert``, ``delete`` and the Beam ``WriteToSupertable``).
``upsert``, ``append`` on a keyed table and ``delete(filter)`` remove (or
refuse) rows, and which rows depends on the version the commit lands on, not
on the version the writer read: another writer may have added a row with the
same key, or a row the filter matches, in between. So the commit loop calls
a :class:`Mutation` with every base it tries (``Manifest.commit(...,
rebuild=...)``), and the mutation returns the request for exactly that base:

- the new superfiles, written once before the race (rebuilt only to put
  them on a grid another writer stamped first, see ``writer.GridAgreement``);
- for each superfile holding live rows it removes, one new deletion vector
  listing the rows still live in that base (a concurrent delete of some of
  the same rows merges instead of conflicting; a superfile may carry several
  vectors);
- the frontier, checked against the base's (it only moves forward).

A commit lands only as ``base + 1``, so what the mutation saw is what it
changes: at most one live row per key, whatever the concurrency, and the
last committer wins.

Cost: what a superfile matches never changes (superfiles are immutable), so
matches are cached by superfile id and a retry on a newer base reads only
the superfiles added since. For keys, a superfile is read only when its key
statistics (range, bloom filter) say it may hold one of the keys, and then
only its key columns; a filter reads the superfiles its column statistics do
not rule out.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import DuplicateKeyError, FrontierError
from beam_supertable.format import deletes as dv
from beam_supertable.format.filters import mask, may_match
from beam_supertable.format.keys import KeyBatch, read_key_section
from beam_supertable.format.manifest import CommitRequest, Snapshot
from beam_supertable.table.handle import TableHandle

__all__ = ["FRONTIER", "Mutation", "check_frontier"]

FRONTIER = "frontier"   # table property: the source frontier of the last commit that set one

_NONE = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def check_frontier(uri: str, frontier: Optional[int], held: Optional[int], version: int) -> None:
    """Raises FrontierError when ``frontier`` is below the frontier ``held`` at ``version``."""
    if frontier is not None and held is not None and frontier < held:
        raise FrontierError(
            f"{uri}: this commit's frontier {frontier} is lower than the table's frontier "
            f"{held} at version {version}; a frontier only moves forward (the commands "
            f"before {held} are already applied). Nothing was committed.")


class Mutation:
    """Builds one write's commit request on any base (the ``rebuild`` of a commit).

    Args:
        table: the handle writing (its readers and deletion-vector cache are
            shared, so ``table.io`` counts the bytes resolution reads).
        operation: the word for history.
        keys: the write's keys; their live rows are replaced (or refused).
        refuse_live: raise DuplicateKeyError instead of replacing a live key.
        filter: rows matching this expression are deleted.
        frontier: the source frontier this commit records.
        token, metadata, base_version: as in ``CommitRequest``.
    """

    def __init__(self, table: TableHandle, operation: str, *,
                 keys: Optional[KeyBatch] = None, refuse_live: bool = False,
                 filter: Optional[pc.Expression] = None,  # noqa: A002
                 frontier: Optional[int] = None, token: Optional[str] = None,
                 metadata: Optional[Dict[str, Any]] = None,
                 base_version: Optional[int] = None) -> None:
        self._table = table
        self._operation = operation
        self._keys = keys if keys is not None and len(keys) else None
        self._refuse_live = refuse_live
        self._filter = filter
        self._frontier = frontier
        self._token = token
        self._metadata = dict(metadata or {})
        if frontier is not None:
            self._metadata[FRONTIER] = frontier
        self._base_version = base_version
        self._found: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        self._vectors: Dict[Tuple[str, bytes], str] = {}
        self.removed_rows = 0

    # -- resolution --------------------------------------------------------
    def live(self, base: Snapshot) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
        """Per superfile of ``base``: (live rows this write removes, their key indices)."""
        if self._keys is None and self._filter is None:
            return {}
        out = {}
        for entry in base.entries():
            found = self._found.get(entry["id"])
            if found is None:
                found = self._found[entry["id"]] = self._find(entry, base)
            rows, which = found
            if len(rows) == 0:
                continue
            keep = ~np.isin(rows, self._table._deleted_rows(entry, base))
            if keep.any():
                out[entry["id"]] = (rows[keep], which[keep])
        return out

    def _find(self, entry: dict, base: Snapshot) -> Tuple[np.ndarray, np.ndarray]:
        """Every row of one superfile the write removes, live or not (cached by id)."""
        if self._keys is not None:
            candidates = np.where(self._keys.may_hold(entry))[0]
            if len(candidates) == 0:
                return _NONE
        elif not may_match(entry, self._filter, base.schema):
            return _NONE
        # Deletes only accumulate on the newer bases a retry sees, so a
        # superfile with no live row left never needs reading again.
        if len(self._table._deleted_rows(entry, base)) >= entry["rows"]:
            return _NONE
        if self._keys is not None:
            return self._keys.match(self._key_columns(entry), candidates)
        rows = np.where(mask(self._table._reader(entry).read(), self._filter))[0].astype(np.int64)
        return rows, np.zeros(len(rows), np.int64)

    def _key_columns(self, entry: dict) -> pa.Table:
        """A superfile's key columns: its key section (one ranged read), else a
        projected Parquet read (a footer read plus a request per row group)."""
        names = self._table.primary_key
        section = entry["keys"].get("section") if entry.get("keys") else None
        if section is None:
            return self._table._reader(entry).read(columns=names).select(names)
        offset, length = section
        data = self._table.store.get_range(entry["path"], offset, offset + length)
        self._table.io.add(len(data))
        return read_key_section(data).select(names)

    def _vector(self, sf: str, rows: np.ndarray) -> str:
        """A deletion vector of ``rows`` of superfile ``sf``, uploaded once per row set."""
        key = (sf, rows.tobytes())
        path = self._vectors.get(key)
        if path is None:
            path = dv.new_path()
            self._table.store.put_if_absent(path, dv.encode(rows))
            self._vectors[key] = path
        return path

    # -- the rebuild ---------------------------------------------------------
    def request(self, base: Snapshot, *, entries: Sequence[dict] = (),
                stamp: Optional[Dict[str, Any]] = None) -> Optional[CommitRequest]:
        """The commit request on ``base``, or None when it would change nothing.

        Raises:
            FrontierError: the frontier is below the base's.
            DuplicateKeyError: ``refuse_live`` and a key is live in ``base``.
        """
        held = base.properties.get(FRONTIER)
        check_frontier(self._table.uri, self._frontier, held, base.version)
        removed = self.live(base)
        # What the request on the last base tried removes (a result's count).
        self.removed_rows = int(sum(len(rows) for rows, _ in removed.values()))
        if self._refuse_live and removed:
            sf, (rows, which) = next(iter(removed.items()))
            raise DuplicateKeyError(
                f"{self._table.uri}: key {self._keys.describe(int(which[0]))} is already in the "
                f"table (row {int(rows[0])} of superfile {sf}, version {base.version}); "
                f"{self._operation} refuses keys the table holds, upsert replaces them. "
                f"Nothing was committed.")
        moves = self._frontier is not None and self._frontier != held
        if not entries and not removed and not moves:
            return None
        return self._build(entries, stamp, removed)

    def draft(self, entries: Sequence[dict] = ()) -> CommitRequest:
        """The request before any base resolves it: what ``Manifest.commit``
        names the commit by (operation, token, the rows for the fingerprint)."""
        return self._build(entries, None, {})

    def _build(self, entries: Sequence[dict], stamp: Optional[Dict[str, Any]],
               removed: Dict[str, Tuple[np.ndarray, np.ndarray]]) -> CommitRequest:
        """The one place a write's ``CommitRequest`` is made."""
        properties = dict(stamp or {})
        replace: Tuple[str, ...] = ()
        if self._frontier is not None:
            properties[FRONTIER] = self._frontier
            replace = (FRONTIER,)
        return CommitRequest(
            operation=self._operation, add_entries=tuple(entries),
            add_deletes={sf: self._vector(sf, rows) for sf, (rows, _) in removed.items()},
            deleted_rows=int(sum(len(rows) for rows, _ in removed.values())),
            set_properties=properties, replace_properties=replace, token=self._token,
            metadata=dict(self._metadata), base_version=self._base_version,
            # What a delete selects names it too: the same token with another
            # filter is another commit.
            fingerprint_extra="" if self._filter is None else f"filter={self._filter}")
