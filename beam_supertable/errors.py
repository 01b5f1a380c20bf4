"""The supertable's exceptions: one base, each subclassing what callers already catch."""


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
    """A commit did not land within its retry budget, or conflicts with a newer version."""


class SchemaMismatchError(SupertableError, ValueError):
    """Data or a commit does not match the table's schema."""


class MemoryBudgetError(SupertableError, MemoryError):
    """An operation would exceed its memory budget; nothing was written."""


class DuplicateKeyError(SupertableError, ValueError):
    """A write names a primary key twice, or appends a key the table already holds."""


class FrontierError(SupertableError, ValueError):
    """A commit would move the table's source frontier backwards."""
