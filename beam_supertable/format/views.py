"""Faces derived from a table's versions, which the commit loop keeps in step.

The storage layer knows no face above it. A face such as the Iceberg metadata
(:mod:`beam_supertable.iceberg`, which registers itself here) is a function of
the versions: the commit loop tells it of each version it creates, and vacuum
asks it which of its objects a retained version needs and which objects are
its own. A face registers a factory; every :class:`~.manifest.Manifest` holds
one view of each.
"""

from __future__ import annotations

from typing import Any, Callable, List, Protocol, Sequence, Set

from beam_supertable.format.documents import Snapshot

__all__ = ["DerivedView", "ViewFactory", "register_view", "views_for"]


class DerivedView(Protocol):
    """What the commit loop and vacuum ask of a derived face."""

    def after_commit(self, snapshot: Snapshot) -> None:
        """Called once a version this process created has landed."""

    def settle(self) -> None:
        """Returns once what this process is writing for the face is written (before
        the store is listed: an object half written is not taken for an orphan)."""

    def needed_by(self, snapshot: Snapshot) -> Set[str]:
        """The face's objects (store paths) that a retained version needs."""

    def owns(self, path: str) -> bool:
        """Whether ``path`` is the face's, so vacuum may remove it once unneeded."""

    def after_vacuum(self, latest: Snapshot, retained: Sequence[int]) -> None:
        """Called after a vacuum removed versions; ``retained`` are those kept."""

    def after_tags(self, latest: Snapshot) -> None:
        """Called after a tag was created, moved or deleted (the face may name tags)."""


ViewFactory = Callable[[Any], DerivedView]   # called with the Manifest the view serves

_FACTORIES: List[ViewFactory] = []


def register_view(factory: ViewFactory) -> None:
    """Adds a face every manifest made from now on keeps in step (once per factory)."""
    if factory not in _FACTORIES:
        _FACTORIES.append(factory)


def views_for(manifest: Any) -> List[DerivedView]:
    """One view of each registered face for ``manifest``."""
    return [factory(manifest) for factory in _FACTORIES]
