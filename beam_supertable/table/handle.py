"""What a table operation needs of the table it works on.

Operations (``mutation``, ``optimize``, ``lookup``) take a handle of this
shape instead of importing :class:`~beam_supertable.table.supertable.Supertable`, which
calls them: the dependency points one way, from the facade down to its
operations. ``Supertable`` is the one implementation.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Protocol, Sequence

import numpy as np
import pyarrow as pa

from beam_supertable.format.documents import CommitRequest, Snapshot
from beam_supertable.format.reader import IOStats, SuperfileReader
from beam_supertable.format.store import ObjectStore
from beam_supertable.format.writer import Layout

__all__ = ["TableHandle"]


class TableHandle(Protocol):
    """A handle on one version of a table (see ``Supertable`` for each member)."""

    io: IOStats

    @property
    def uri(self) -> str: ...

    @property
    def store(self) -> ObjectStore: ...

    @property
    def version(self) -> int: ...

    @property
    def snapshot(self) -> Snapshot: ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def primary_key(self) -> List[str]: ...

    def layout(self) -> Layout: ...

    def grid(self) -> Optional[np.ndarray]: ...

    def superfiles(self) -> List[dict]: ...

    def read_superfile(self, entry: dict, columns: Sequence[str],
                       filter: Any = None) -> pa.Table: ...  # noqa: A002

    def _reader(self, entry: dict, schema: Optional[pa.Schema] = None
                ) -> SuperfileReader: ...

    def _deleted_rows(self, entry: dict, snapshot: Optional[Snapshot] = None
                      ) -> np.ndarray: ...

    def commit(self, request: CommitRequest, *,
               rebuild: Optional[Callable[[Snapshot], Optional[CommitRequest]]] = None,
               **kwargs: Any) -> int: ...

    def commit_superfiles(self, entries: Sequence[dict], mutation: Any = None, *,
                          grids: Any = (), max_retries: int = ...) -> int: ...

    def refresh(self) -> "TableHandle": ...
