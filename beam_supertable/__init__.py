"""A table of Parquet superfiles on any fsspec object store, committed with OCC."""

from beam_supertable._version import __version__
from beam_supertable.errors import (
    AlreadyExists, CommitConflictError, CommitFailedError, CorruptManifestError,
    DuplicateKeyError, FrontierError, MemoryBudgetError, NotATableError, SchemaMismatchError,
    StoreIOError, SupertableError, TableExistsError, TokenReuseError, UnsafeBackendError,
    VersionNotFoundError)
from beam_supertable.inspection import inspect_table
from beam_supertable.manifest import CommitRequest, Manifest, Snapshot, VacuumPlan, VacuumReport
from beam_supertable.optimize import OptimizeGroup, OptimizePlan
from beam_supertable.store import ObjectInfo, ObjectStore
from beam_supertable.table import Supertable

__all__ = [
    "__version__",
    "CommitResult", "ReadFromSupertable", "UpsertToSupertable", "WriteResult",
    "WriteToSupertable",
    "AlreadyExists", "CommitConflictError", "CommitFailedError", "CommitRequest",
    "CorruptManifestError", "DuplicateKeyError", "FrontierError",
    "Manifest", "MemoryBudgetError", "NotATableError", "OptimizeGroup", "OptimizePlan", "ObjectInfo", "ObjectStore", "SchemaMismatchError",
    "Snapshot", "StoreIOError", "Supertable", "SupertableError", "TableExistsError",
    "TokenReuseError", "UnsafeBackendError",
    "VacuumPlan", "VacuumReport", "VersionNotFoundError", "inspect_table",
]


def __getattr__(name):
    # The Beam transforms import apache_beam; the table itself does not need it.
    if name in ("WriteToSupertable", "CommitResult", "WriteResult"):
        from beam_supertable import write
        return getattr(write, name)
    if name == "ReadFromSupertable":
        from beam_supertable import read
        return read.ReadFromSupertable
    if name == "UpsertToSupertable":
        from beam_supertable import upsert_write
        return upsert_write.UpsertToSupertable
    raise AttributeError(f"module 'beam_supertable' has no attribute {name!r}")
