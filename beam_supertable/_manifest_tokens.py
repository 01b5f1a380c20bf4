"""Idempotency tokens: the markers a tokened commit leaves, and how it finds itself.

Before creating version N a tokened commit creates
``_supertable/tokens/<sha256(token)>/<N:020d>.json`` (JSON ``{"token", "version"}``),
so one listing of the token's folder names every version its commits tried."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Optional


from beam_supertable.errors import (
    AlreadyExists, TokenReuseError)
from beam_supertable._manifest_doc import RECENT_TOKENS, TOKENS, VERSION_DIGITS, Snapshot


def token_folder(token: str) -> str:
    """Where the markers of ``token`` live (one folder per token)."""
    return f"{TOKENS}/{hashlib.sha256(token.encode('utf-8')).hexdigest()}"

_LOG = logging.getLogger(__name__)


def token_marker_path(token: str, version: int) -> str:
    """The marker a commit with ``token`` leaves before it creates ``version``."""
    return f"{token_folder(token)}/{version:0{VERSION_DIGITS}d}.json"


def _marker_version(path: str) -> Optional[int]:
    name = path.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


class TokenIndex:
    """The token markers of a table: where a tokened commit looks for itself.

    Mixed into :class:`~beam_supertable.manifest.Manifest`; uses its ``store``,
    ``_try_version`` and ``_snapshot``.
    """

    def _find_token(self, token: str, base: Snapshot, since: Optional[int],
                    window: int = RECENT_TOKENS) -> Optional[Snapshot]:
        """The version holding ``token`` at or below ``base``, else None.

        ``window`` is how many tokens each version carries (the committer's
        ``RECENT_TOKENS``): past it the token is looked for by its markers.
        """
        if token in base.recent_tokens:
            # The recent window says it landed at or before base; find which.
            version = base.version
            while version >= 0:
                doc = self._try_version(version)
                if doc is None:
                    break
                if doc.get("commit", {}).get("token") == token:
                    return self._snapshot(doc)
                version -= 1
            # Its version was vacuumed: what it committed cannot be checked
            # against this commit, so neither skipping nor committing is safe.
            raise TokenReuseError(
                f"{self.store.uri}: token {token!r} landed in a version that has since been "
                f"vacuumed (the oldest retained is after {version}), so this commit on "
                f"version {base.version} cannot be checked against it; use a fresh token",
                token=token, landed_version=None, base_version=base.version)
        if since is not None and since <= base.version - window:
            # ``since`` itself may hold the token (a handle standing on its own commit).
            for version in range(base.version - window, since - 1, -1):
                doc = self._try_version(version)
                if doc is not None and doc.get("commit", {}).get("token") == token:
                    return self._snapshot(doc)
        return self._find_token_marker(token, base)

    def _find_token_marker(self, token: str, base: Snapshot) -> Optional[Snapshot]:
        """The version at or below ``base`` holding ``token``, by its markers.

        One listing of the token's folder plus one read per version a commit
        with the token tried (normally none or one): the cost does not grow
        with the table's history. A marker above ``base`` belongs to an
        attempt this base cannot show yet; the next round's base will.
        """
        markers = []
        for info in self.store.list(token_folder(token)):
            version = _marker_version(info.path)
            if version is not None and version <= base.version:
                markers.append((version, info.path))
        for version, path in sorted(markers, reverse=True):
            doc = self._try_version(version)
            if doc is None:
                raise TokenReuseError(
                    f"{self.store.uri}: a commit with token {token!r} tried version {version}, "
                    f"which has since been vacuumed, so whether the token landed there "
                    f"cannot be told and this commit on version {base.version} cannot be "
                    f"checked against it; use a fresh token",
                    token=token, landed_version=None, base_version=base.version)
            if doc.get("commit", {}).get("token") == token:
                return self._snapshot(doc)
            # Another commit holds that version: the marker's attempt lost its
            # race for good (versions are immutable), so it can go.
            self._drop_marker(path)
        return None

    def _mark_token(self, token: str, version: int) -> None:
        """Leaves the token's marker for ``version`` (before creating it)."""
        try:
            self.store.put_if_absent(token_marker_path(token, version), json.dumps(
                {"token": token, "version": version}, sort_keys=True).encode())
        except AlreadyExists:
            pass  # the same token tried this version before (a retry): one marker does

    def _drop_marker(self, path: str) -> None:
        # Best effort: a stale marker costs a read of its version, never correctness.
        try:
            self.store.delete(path)
        except Exception as exc:  # noqa: BLE001 - the marker is only a hint
            _LOG.info("%s: could not remove stale token marker %s: %s",
                      self.store.uri, path, exc)
