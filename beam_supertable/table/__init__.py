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

from beam_supertable._moved import old_names

# The names of the module this package replaced (``from beam_supertable.table import *``).
__all__ = ["CREATE_MODES", "CreateMode", "Metric", "Supertable"]

# ``beam_supertable.table`` was the module of ``Supertable`` before it was a package.
__getattr__ = old_names(__name__, ("beam_supertable.table.supertable",))


def __dir__():
    return sorted(set(globals()) | set(__all__))
