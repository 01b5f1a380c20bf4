"""One LRU byte budget per ``Supertable`` handle.

Everything a handle keeps from its superfiles after a read — the opened
readers (their Parquet footers), index sections, text indexes, ``_id``
columns, decoded SQ8 codes, fp32 rerank vectors, deletion vectors, bloom
filters — is charged to one ``ByteCache``, and the least recently used
values go first when the budget is exceeded. Superfiles are immutable, so a
value never goes stale; an evicted one is read again when next needed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Tuple

__all__ = ["DEFAULT_CACHE_BYTES", "ByteCache"]

DEFAULT_CACHE_BYTES = 1 << 30   # 1 GiB per Supertable handle


class ByteCache:
    """A thread-safe LRU map whose values are charged by their size in bytes.

    Args:
        capacity_bytes: the budget; 0 keeps nothing.

    Note:
        A value larger than the whole budget is returned to its caller but
        not kept. Callers hold on to what they use: eviction only drops the
        cache's reference.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) \
                or capacity_bytes < 0:
            raise ValueError(f"cache_bytes must be an int >= 0, got {capacity_bytes!r}")
        self._capacity = capacity_bytes
        self._lock = threading.Lock()
        self._items: "OrderedDict[Hashable, Tuple[Any, int]]" = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes currently charged (never above ``capacity_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value under ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return default
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> Any:
        """Keeps ``value`` under ``key``, evicting the least recently used; returns it."""
        nbytes = max(0, int(nbytes))
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if nbytes > self._capacity:
                return value
            while self._items and self._bytes + nbytes > self._capacity:
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size
                self.evictions += 1
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
        return value

    def get_or_load(self, key: Hashable, load: Callable[[], Tuple[Any, int]]) -> Any:
        """The cached value, or ``load() -> (value, nbytes)``'s, kept for next time."""
        value = self.get(key)
        if value is None:
            value, nbytes = load()
            self.put(key, value, nbytes)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def stats(self) -> dict:
        with self._lock:
            return {"bytes": self._bytes, "capacity_bytes": self._capacity,
                    "entries": len(self._items), "hits": self.hits, "misses": self.misses,
                    "evictions": self.evictions}

