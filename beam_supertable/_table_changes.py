"""The table's change feed (mixed into ``Supertable``): ``changes``.

See :mod:`beam_supertable.changes` for how a range of versions is read.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from beam_supertable import changes as change_feed


class TableChanges:
    """``Supertable.changes`` (mixed into the table)."""

    def changes(self, start_version: int, end_version: Optional[int] = None, *,
                columns: Optional[Sequence[str]] = None,
                filter: Optional[pc.Expression] = None,  # noqa: A002
                consolidate: bool = False) -> pa.Table:
        """Every logical change of versions ``start_version + 1 … end_version``.

        One row per row a version inserted (``_change`` = +1) and per row it
        retracted (``_change`` = −1), with the version (``_version``) and its
        commit time (``_commit_timestamp``, UTC), the row's ``_id`` and the
        user columns asked for, in version order, retractions first within a
        version. An upsert that replaces a key yields the old row's retraction
        and the new row's insertion; a delete yields retractions; an append
        insertions; ``optimize`` (rows rewritten under their own ``_id`` s) and
        ``vacuum`` nothing. Replaying the changes on the rows of
        ``start_version`` gives the rows of every later version of the range.

        Only what the range touched is read: the columns asked for of the
        superfiles it added, and the row groups holding the rows its new
        deletion vectors name; never a whole snapshot. A ``filter`` skips
        superfiles by their statistics, as ``to_arrow`` does.

        Args:
            start_version: the version the changes start from (exclusive).
            end_version: the last version included (default, or ``"latest"``:
                the latest).
            columns: user columns to return (default: all); ``_id`` always is.
            filter: a pyarrow expression the changed rows must satisfy.
            consolidate: drop changes that cancel inside the range (per
                ``_id``, or per primary key on a keyed table, whose rows are
                compared on their user columns, without ``_id``), leaving
                exactly ``rows(end) − rows(start)`` as a multiset difference.

        Returns:
            A ``pyarrow.Table``: ``_id``, the columns, ``_change`` (int8),
            ``_version`` (int64), ``_commit_timestamp`` (timestamp[us, UTC]);
            empty, with that schema, when the range changed nothing.

        Raises:
            ValueError: ``start_version > end_version``, not an int, or a column
                asked for twice.
            VersionNotFoundError: a version past the latest, or ``start_version``
                removed by ``vacuum`` (the message names the oldest version still
                readable).
            SchemaMismatchError: an unknown column, a filter the columns cannot
                evaluate, or a version of the range changed the table's schema.
        """
        return change_feed.changes(self, start_version, end_version, columns=columns,
                                   filter=filter, consolidate_changes=consolidate)
