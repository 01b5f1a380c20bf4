"""``Supertable`` and its operations: the table as users call it.

- :mod:`.supertable`: the ``Supertable`` class, the one face (open, create,
  write, read, search, changes, maintenance, the Iceberg location);
- :mod:`.writes` (the write path) and :mod:`.search` (vector, text and hybrid
  search), the collaborators a table handle holds;
- operations over a table handle (:mod:`.handle`): :mod:`.mutation`
  (what a commit removes), :mod:`.lookup`, :mod:`.optimize` and
  :mod:`.optimize_plan`, :mod:`.changes` (the change feed),
  :mod:`.inspection`, :mod:`.dataset` (the live rows for DuckDB and Polars).

It imports the storage layer (``format/``), the Iceberg face (``iceberg/``)
and the indexes (``vector/``, ``fts/``), never apache_beam or the transforms.
"""

import importlib
import warnings

# The names of the module this package replaced (``from beam_supertable.table import *``).
__all__ = ["CREATE_MODES", "CreateMode", "Metric", "Supertable"]


def __getattr__(name):
    # ``beam_supertable.table`` was the module of ``Supertable`` before it was a package.
    module = importlib.import_module("beam_supertable.table.supertable")
    if name.startswith("__") or not hasattr(module, name):
        raise AttributeError(f"module 'beam_supertable.table' has no attribute {name!r}")
    warnings.warn(f"beam_supertable.table.{name} moved to beam_supertable.table.supertable "
                  f"(Supertable: import it from beam_supertable); the old path goes in 0.4",
                  DeprecationWarning, stacklevel=2)
    value = globals()[name] = getattr(module, name)   # warned once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
