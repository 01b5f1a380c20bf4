"""A table of Parquet superfiles on any fsspec object store, committed with OCC.

The public API is what ``__all__`` lists: the ``Supertable`` facade, the Beam
transforms and their results, the maintenance reports and the errors. Beam's
RAG integration lives in :mod:`beam_supertable.rag`, test utilities in
:mod:`beam_supertable.testing`. Every other module is internal: it may change
between releases (``Manifest`` and ``CommitRequest`` stay importable from
``beam_supertable.format.manifest``, ``ObjectStore`` from ``beam_supertable.format.store``).
"""

import importlib
import warnings

from beam_supertable import _moved

_moved.install()   # first: a thread may import an old path while this package loads

from beam_supertable._version import __version__
from beam_supertable.errors import (
    AlreadyExists, CommitConflictError, CommitFailedError, ConsumerNotFoundError,
    CorruptManifestError, DuplicateKeyError, FrontierError, MemoryBudgetError, NotATableError, SchemaMismatchError, StoreIOError,
    SupertableError, TableExistsError, TokenReuseError, UnsafeBackendError, VersionNotFoundError)
from beam_supertable.format.consumers import Consumer
from beam_supertable.format.manifest import Snapshot, VacuumPlan, VacuumReport
from beam_supertable.table.inspection import inspect_table
from beam_supertable.table.merge_insert import MergeInsertBuilder, MergeResult
from beam_supertable.table.optimize import OptimizeGroup, OptimizePlan
from beam_supertable.table.supertable import Supertable
from beam_supertable.errors import TagExistsError, TagNotFoundError  # noqa: E402 - tags
from beam_supertable.table.tags import Tags

__all__ = [
    "__version__",
    # the table
    "Supertable", "Snapshot", "OptimizeGroup", "OptimizePlan", "VacuumPlan", "VacuumReport",
    "Consumer", "inspect_table", "MergeInsertBuilder", "MergeResult",
    # the Beam transforms
    "CommitResult", "ReadChangesFromSupertable", "ReadFromSupertable", "UpsertToSupertable", "UpsertWriteResult",
    "WriteResult", "WriteToSupertable",
    # errors
    "AlreadyExists", "CommitConflictError", "CommitFailedError", "ConsumerNotFoundError",
    "CorruptManifestError",
    "DuplicateKeyError", "FrontierError", "MemoryBudgetError", "NotATableError",
    "SchemaMismatchError", "StoreIOError", "SupertableError", "TableExistsError",
    "TokenReuseError", "UnsafeBackendError", "VersionNotFoundError",
]
__all__ += ["Tags", "TagExistsError", "TagNotFoundError"]   # tags: names for versions

# The Beam transforms import apache_beam; the table itself does not need it.
_LAZY = {
    "WriteToSupertable": "beam_supertable.transforms.write",
    "CommitResult": "beam_supertable.transforms.write",
    "WriteResult": "beam_supertable.transforms.write",
    "ReadFromSupertable": "beam_supertable.transforms.read",
    "ReadChangesFromSupertable": "beam_supertable.transforms.read_changes",
    "UpsertToSupertable": "beam_supertable.transforms.upsert_write",
    "UpsertWriteResult": "beam_supertable.transforms.upsert_write",
}
# Internals this package once exported: still importable here, with a warning,
# until 0.4; their modules keep them.
_INTERNAL = {
    "Manifest": "beam_supertable.format.manifest",
    "CommitRequest": "beam_supertable.format.manifest",
    "ObjectStore": "beam_supertable.format.store",
    "ObjectInfo": "beam_supertable.format.store",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if f"{__name__}.{name}" in _moved.MOVED:   # ``beam_supertable.manifest`` and the like
        return importlib.import_module(f"{__name__}.{name}")
    if name in _INTERNAL:
        module = _INTERNAL[name]
        warnings.warn(f"beam_supertable.{name} is internal and leaves the package namespace "
                      f"in 0.4; import it from {module}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'beam_supertable' has no attribute {name!r}")
