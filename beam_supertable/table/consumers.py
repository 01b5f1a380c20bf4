"""Named consumers of a table's change feed: where a reader resumes, and reads that
advance it (``Supertable.changes(consumer=...)``, ``ReadChangesFromSupertable``).

The records themselves, and what vacuum keeps for them, are
:mod:`beam_supertable.format.consumers`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable.errors import ConsumerNotFoundError, VersionNotFoundError
from beam_supertable.format import consumers as named
from beam_supertable.format.consumers import Consumer
from beam_supertable.table import changes as feed
from beam_supertable.table.handle import TableHandle

__all__ = ["drop", "listing", "read", "register", "resume"]


def listing(handle: TableHandle) -> List[Consumer]:
    manifest = handle.snapshot.manifest
    return named.listing(handle.store, manifest.clock(),
                         named.consumer_expiry_of(handle.snapshot.properties))


def drop(handle: TableHandle, name: str) -> None:
    if not named.drop(handle.store, named.check_name(name)):
        raise ConsumerNotFoundError(f"{handle.uri}: no consumer named {name!r}")


def resume(handle: TableHandle, name: str, start_version: Optional[int],
           where: str) -> Tuple[int, bool]:
    """``(version, recorded)``: where consumer ``name`` reads on from (its recorded
    version, else ``start_version``) and whether it was recorded already. A
    recorded version that vacuum removed is refused in one line."""
    named.check_name(name)
    at = named.recorded(handle.store, name)
    if at is None:
        if start_version is None:
            raise ValueError(f"{where}: consumer {name!r} has no recorded position yet; give "
                             f"start_version for its first read")
        return start_version, False
    manifest = handle.snapshot.manifest
    if at != handle.version and manifest._try_version(at) is None:
        listed = manifest._listed_versions()
        raise VersionNotFoundError(
            f"{where}: {handle.uri}: consumer {name!r} is at version {at}, which vacuum removed "
            f"(it had not recorded for the table's consumer_expiry); the oldest version still "
            f"readable is {listed[0] if listed else None}. Drop it (drop_consumer({name!r})) "
            f"and start again from a snapshot of that version")
    return at, True


def register(handle: TableHandle, name: str, version: int, where: str) -> None:
    """Records a new consumer at ``version``, then checks that version is still there
    (recorded first, so a vacuum from now on keeps it); undone when it is not."""
    named.record(handle.store, name, version, handle.snapshot.manifest.clock())
    try:
        feed.load(handle, version)
    except VersionNotFoundError:
        named.drop(handle.store, name)
        raise


def read(handle: TableHandle, name: str, start_version: Optional[int],
         end_version, *, columns: Optional[Sequence[str]],
         filter: Optional[pc.Expression],  # noqa: A002
         consolidate_changes: bool) -> pa.Table:
    """The changes after consumer ``name``'s version up to ``end_version``; then the
    consumer is at ``end_version``. An end at or before its version reads nothing
    and leaves the version as it is, but counts as a sign of life (the record is
    written again, so a poller of a quiet table never expires)."""
    where = "changes"
    if end_version is not None and end_version != "latest" and (
            isinstance(end_version, bool) or not isinstance(end_version, int)
            or end_version < 0):
        raise ValueError(f"{where}: end_version must be an int >= 0, 'latest' or None, got "
                         f"{end_version!r}")
    start, known = resume(handle, name, start_version, where)
    latest = handle.snapshot.manifest.latest_version()
    end = latest if end_version is None or end_version == "latest" else end_version
    if not known:
        # Every argument checked before anything is recorded: a refused first read
        # registers nothing.
        feed.versions_between(handle, start, end)
        first = feed.load(handle, start)
        feed.change_columns(first, columns)
        feed.check_filter(first.schema, filter)
        register(handle, name, start, where)
    out = feed.changes(handle, start, max(start, end), columns=columns, filter=filter,
                       consolidate_changes=consolidate_changes)
    named.record(handle.store, name, max(start, end), handle.snapshot.manifest.clock())
    return out
