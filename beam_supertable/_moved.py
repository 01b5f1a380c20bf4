"""Old import paths of modules that moved into the package's layers.

``beam_supertable.manifest`` is now ``beam_supertable.format.manifest``, and so
on. Until 0.4 the old path still imports the module, with a
``DeprecationWarning`` naming the new one: the old name is the same module
object, so what a user patched or imported through it is what the package
uses. Private modules (``_table_search`` and the like) moved without one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable, Dict, Sequence

MOVED: Dict[str, str] = {
    f"beam_supertable.{old}": f"beam_supertable.{new}" for old, new in {
        "cache": "format.cache", "deletes": "format.deletes", "digest": "format.digest",
        "expression": "format.expression", "filters": "format.filters", "ids": "format.ids",
        "keys": "format.keys", "manifest": "format.manifest", "reader": "format.reader",
        "schema": "format.schema", "store": "format.store", "superfile": "format.superfile",
        "writer": "format.writer",
        "changes": "table.changes", "inspection": "table.inspection",
        "lookup": "table.lookup", "mutation": "table.mutation", "optimize": "table.optimize",
        "read": "transforms.read", "read_changes": "transforms.read_changes",
        "upsert_write": "transforms.upsert_write", "write": "transforms.write",
    }.items()}


_SPECS: Dict[str, object] = {}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module that now lives at the new one."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path is deprecated and goes in 0.4",
                      DeprecationWarning, stacklevel=2)   # importlib's frames are skipped
        module = importlib.import_module(new)
        # The import machinery sets the old name's spec on it next; keep the real one
        # (by the module's own name: two threads may import two old paths at once).
        _SPECS[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # The module ran when it was imported by its new name; it keeps that name's spec.
        module.__spec__ = _SPECS.get(module.__name__, module.__spec__)


def install() -> None:
    """Makes the old paths importable (once per interpreter)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def old_names(module: str, homes: Sequence[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving the names ``module`` held before the package's
    folders from the modules that define them now (``homes``, imported on first use),
    with a warning naming where they live (once: the name is kept in ``module``), until
    0.4."""
    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            for home in homes:
                found = importlib.import_module(home)
                if hasattr(found, name):
                    warnings.warn(f"{module}.{name} moved to {home}; import it from there "
                                  f"(the old name goes in 0.4)", DeprecationWarning,
                                  stacklevel=2)
                    value = getattr(found, name)
                    setattr(sys.modules[module], name, value)
                    return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
