"""A table of Parquet superfiles on any fsspec object store, committed with OCC."""

from beam_supertable.errors import (
    AlreadyExists, CommitConflictError, CorruptManifestError, MemoryBudgetError, NotATableError,
    SchemaMismatchError, SupertableError, TableExistsError, UnsafeBackendError,
    VersionNotFoundError)
from beam_supertable.manifest import CommitRequest, Manifest, Snapshot, VacuumReport
from beam_supertable.store import ObjectInfo, ObjectStore
from beam_supertable.table import Supertable

__all__ = [
    "AlreadyExists", "CommitConflictError", "CommitRequest", "CorruptManifestError",
    "Manifest", "MemoryBudgetError", "NotATableError", "ObjectInfo", "ObjectStore", "SchemaMismatchError",
    "Snapshot", "Supertable", "SupertableError", "TableExistsError", "UnsafeBackendError",
    "VacuumReport", "VersionNotFoundError",
]
