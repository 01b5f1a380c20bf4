"""The supertable's exceptions: one base, each subclassing what callers already catch."""

from typing import Optional

__all__ = [
    "IcebergDisabledError",
    "AlreadyExists", "CommitConflictError", "CommitFailedError", "CorruptManifestError",
    "DuplicateKeyError", "FrontierError", "MemoryBudgetError", "NotATableError",
    "SchemaMismatchError", "StoreIOError", "SupertableError", "TableExistsError",
    "TokenReuseError", "UnsafeBackendError", "VersionNotFoundError",
]


class SupertableError(Exception):
    """Base of every error raised by beam_supertable."""


class AlreadyExists(SupertableError, FileExistsError):
    """An atomic create found the object already there."""


class UnsafeBackendError(SupertableError, ValueError):
    """The store cannot create objects atomically, so concurrent writers could corrupt it."""


class NotATableError(SupertableError, FileNotFoundError):
    """The path holds no supertable."""


class TableExistsError(SupertableError, FileExistsError):
    """A table already exists where one was to be created."""


class VersionNotFoundError(SupertableError, FileNotFoundError):
    """The requested table version does not exist (or was vacuumed)."""


class CorruptManifestError(SupertableError, ValueError):
    """A manifest object is unreadable or does not match its own hash."""


class CommitConflictError(SupertableError):
    """A commit conflicts with a newer version in a way a rebase cannot resolve.

    Also the base of :class:`CommitFailedError`, so code that catches this for
    lost races keeps working.
    """


class CommitFailedError(CommitConflictError):
    """A commit did not land within its retry budget (lost races or transient errors)."""


class TokenReuseError(SupertableError, ValueError):
    """An idempotency token already landed with a different commit.

    Attributes:
        token: the reused token.
        landed_version: the version that holds the token's first commit.
        base_version: the version the refused commit was rebased on.
    """

    def __init__(self, message: str, *, token: Optional[str] = None,
                 landed_version: Optional[int] = None,
                 base_version: Optional[int] = None) -> None:
        # One positional argument: Beam re-raises a DoFn's error as
        # ``type(exc)(augmented_message)``, which keeps the type.
        super().__init__(message)
        self.token = token
        self.landed_version = landed_version
        self.base_version = base_version


class SchemaMismatchError(SupertableError, ValueError):
    """Data or a commit does not match the table's schema."""


class MemoryBudgetError(SupertableError, MemoryError):
    """An operation would exceed its memory budget; nothing was written."""


class StoreIOError(SupertableError, ConnectionError):
    """An object-store request failed in transit after its retries; a write may have landed."""


class DuplicateKeyError(SupertableError, ValueError):
    """A write names a primary key twice, or appends a key the table already holds."""


class FrontierError(SupertableError, ValueError):
    """A commit would move the table's source frontier backwards."""


class IcebergDisabledError(SupertableError, ValueError):
    """The table keeps no Iceberg metadata (created with ``iceberg=False``, or by an
    older release): ``Supertable.sync_iceberg()`` turns it on."""


class ConsumerNotFoundError(SupertableError, LookupError):
    """No change-feed consumer of that name is recorded in the table."""


class TagNotFoundError(SupertableError, LookupError):
    """No tag of that name is recorded in the table."""


class TagExistsError(AlreadyExists):
    """A tag of that name exists already (of two creators of one name, one wins)."""
