"""Griffe extension for the API reference: names a package exports lazily.

``beam_supertable`` exports its Beam transforms through a module
``__getattr__``, so that the table imports without apache_beam. Static
analysis cannot see such names. This extension imports the package, asks it
for each name of its ``__all__`` that griffe did not find, and adds an alias
to wherever the object is defined. The API pages name only the public entry
points; where the code behind them lives is found at build time.
"""

from __future__ import annotations

import importlib
from typing import Any

from griffe import Alias, Extension


class LazyExports(Extension):
    """Adds aliases for the ``__all__`` names a package provides at run time."""

    def _add(self, pkg: Any) -> None:
        try:
            module = importlib.import_module(pkg.path)
        except ImportError:
            return
        for name in getattr(module, "__all__", ()):
            if name in pkg.members:
                continue
            obj = getattr(module, name, None)
            where = getattr(obj, "__module__", None)
            qualname = getattr(obj, "__qualname__", None)
            if where and qualname and where.split(".")[0] == pkg.path:
                pkg.set_member(name, Alias(name, f"{where}.{qualname}", parent=pkg))

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:  # griffe >= 2
        self._add(pkg)

    def on_package_loaded(self, *, pkg: Any, **kwargs: Any) -> None:  # griffe 1.x
        self._add(pkg)
