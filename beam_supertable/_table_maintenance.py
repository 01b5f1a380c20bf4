"""How long a table remembers, and what its maintenance reclaims.

Mixed into ``Supertable``: ``vacuum``, and the token retention (``token_retention``,
``set_token_retention``, ``token_horizon``): a rerun is deduplicated if it comes
within ``token_retention`` of the commit it repeats; later, it is a new commit.
"""

from __future__ import annotations

import datetime
from typing import Sequence, Union

from beam_supertable.manifest import (
    DEFAULT_MAX_RETRIES, TOKEN_RETENTION, CommitRequest, VacuumReport)
from beam_supertable._manifest_doc import retention_seconds, token_retention_of

Duration = Union[float, datetime.timedelta]


class TableMaintenance:
    """``vacuum`` and the token retention of ``Supertable`` (mixed into the table)."""

    @property
    def token_retention(self) -> datetime.timedelta:
        """How long after a commit its token is remembered (the table property
        ``token_retention``; 7 days unless set)."""
        return datetime.timedelta(seconds=token_retention_of(self._snapshot.properties))

    def token_horizon(self) -> datetime.datetime:
        """Reruns of commits made at or after this moment (UTC) are deduplicated now."""
        at = self._manifest.clock() - token_retention_of(self._snapshot.properties)
        return datetime.datetime.fromtimestamp(at, datetime.timezone.utc)

    def set_token_retention(self, retention: Duration, *,
                            max_retries: int = DEFAULT_MAX_RETRIES) -> int:
        """Changes the table's ``token_retention`` (seconds or a ``timedelta``) in one
        commit; returns the version holding it (this handle's, when unchanged).

        A longer retention keeps tokens that the next vacuum would have
        forgotten; it cannot bring back those an earlier vacuum removed. The
        change rules the commits and vacuums that start after it commits: a
        shorter one forgets at once the tokens past its horizon.
        """
        seconds = retention_seconds(retention)
        self.refresh()
        if self._snapshot.properties.get(TOKEN_RETENTION) == seconds:
            return self.version
        return self.commit(CommitRequest(
            operation="set_properties", set_properties={TOKEN_RETENTION: seconds},
            replace_properties=(TOKEN_RETENTION,)), max_retries=max_retries)

    def vacuum(self, *, retain_versions: int = 10,
               older_than: Union[float, datetime.timedelta, None] = None,
               dry_run: bool = False,
               token_retention: Union[Duration, None] = None,
               keep_versions: Sequence[int] = ()) -> VacuumReport:
        """Deletes versions and objects no retained version needs, and the token
        markers and index objects past the token horizon (see ``Manifest.vacuum``).

        Args:
            retain_versions: the newest versions kept (at least 1).
            older_than: grace period (seconds or ``timedelta``); ``None`` means
                the default grace (6 hours), ``0`` none.
            dry_run: report what would go without deleting it.
            token_retention: how long tokens are remembered (seconds or a
                ``timedelta``). Given, it becomes the table's ``token_retention``
                first (one commit when it changes; not with ``dry_run``), so
                every later version records the horizon in force.
            keep_versions: versions kept whatever their age, with every
                object they reference (e.g. the version a streaming
                ``UpsertToSupertable`` run started on: it reads priors there).
        """
        if token_retention is not None:
            retention_seconds(token_retention)
            if not dry_run:
                self.set_token_retention(token_retention)
        return self._manifest.vacuum(retain_versions=retain_versions, older_than=older_than,
                                     dry_run=dry_run, token_retention=token_retention,
                                     keep_versions=keep_versions)
