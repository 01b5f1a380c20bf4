"""Named records: one small sealed JSON object per name in a folder under
``_supertable/`` (consumers, tags), listed the same way by every kind."""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from beam_supertable.errors import CorruptManifestError
from beam_supertable.format.store import ObjectInfo, ObjectStore

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def read_all(store: ObjectStore, folder: str, decode: Callable[[bytes, str], Dict[str, Any]],
             objects: Optional[Sequence[ObjectInfo]] = None, *,
             accept: Callable[[str], bool] = lambda name: True,
             skip_unreadable: bool = False,
             log: Optional[logging.Logger] = None) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """``(name, document)`` of every record directly under ``folder``.

    ``objects``: the table's listing when the caller has one. Only
    ``<name>.json`` files whose name is one the kind's own delete could
    remove count (``NAME`` and ``accept``). ``skip_unreadable``: a record that
    is not one is logged and left out (it holds nothing) instead of raising
    ``CorruptManifestError``."""
    infos = store.list(folder) if objects is None else \
        [i for i in objects if i.path.startswith(folder + "/")]
    for info in infos:
        parent, _, file = info.path.rpartition("/")
        name = file[:-len(".json")]
        if parent != folder or not file.endswith(".json") or not NAME.fullmatch(name) \
                or not accept(name):
            continue
        try:
            doc = decode(store.get(info.path), f"{store.uri}/{info.path}")
        except FileNotFoundError:
            continue   # removed since the listing
        except CorruptManifestError as exc:
            if not skip_unreadable:
                raise
            (log or logging.getLogger(__name__)).warning("%s; it holds no version", exc)
            continue
        yield name, doc
