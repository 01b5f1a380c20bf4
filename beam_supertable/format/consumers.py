"""Named readers of the change feed, and how far each has read.

A consumer is one small sealed JSON object, ``_supertable/consumers/<name>.json``:
the last version whose changes it has taken (its next read starts after it,
as ``start_version`` does) and when it recorded that. ``vacuum`` keeps every
version from the oldest live consumer's on (that version is the state the next
changes are read against), so a reader that lags behind a scheduled vacuum
loses nothing. A consumer that has not recorded for the table's
``consumer_expiry`` (7 days unless set) has expired: it holds no versions, and
a reader resuming from it fails at once if its version is gone.

Recording is a plain overwrite (one request; each store's put replaces an
object whole): one consumer name is one reader.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any, Dict, List, Optional, Sequence

from beam_supertable.errors import CorruptManifestError
from beam_supertable.format.documents import (
    FORMAT_VERSION, META, epoch_of, iso_of, retention_seconds, seal, unseal)
from beam_supertable.format import named
from beam_supertable.format.store import ObjectInfo, ObjectStore

CONSUMERS = f"{META}/consumers"
CONSUMER_EXPIRY = "consumer_expiry"   # table property: seconds a silent consumer holds versions
DEFAULT_CONSUMER_EXPIRY_S = 7 * 24 * 3600

_LOG = logging.getLogger(__name__)
_NAME = named.NAME


def check_name(name: Any) -> str:
    """A consumer name: 1–128 letters, digits, ``.``, ``_`` or ``-``, not starting with
    a punctuation mark (it names an object, on every store)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"consumer name must be 1-128 letters, digits, '.', '_' or '-' "
                         f"starting with a letter or digit, got {name!r}")
    return name


def path_of(name: str) -> str:
    return f"{CONSUMERS}/{check_name(name)}.json"


def expiry_seconds(value: Any) -> float:
    """A consumer expiry as seconds > 0 (a number of seconds or a ``timedelta``)."""
    return retention_seconds(value, "consumer_expiry")


def consumer_expiry_of(properties: Dict[str, Any]) -> float:
    """The consumer expiry a version's properties put in force (seconds)."""
    held = properties.get(CONSUMER_EXPIRY)
    return float(held) if isinstance(held, (int, float)) and held > 0 \
        else float(DEFAULT_CONSUMER_EXPIRY_S)


@dataclasses.dataclass(frozen=True)
class Consumer:
    """A named reader of the change feed, as recorded in the table.

    Attributes:
        name: the consumer's name.
        version: the last version whose changes it has taken; it reads on after it.
        updated_at: when it last recorded (UTC).
        age: how long ago that was, when listed.
        expired: silent for the table's ``consumer_expiry``: it holds no versions.
    """

    name: str
    version: int
    updated_at: datetime.datetime
    age: datetime.timedelta
    expired: bool

    def to_dict(self) -> Dict[str, Any]:
        """JSON data: name, version, updated_at (ISO), age_s, expired."""
        return {"name": self.name, "version": self.version,
                "updated_at": self.updated_at.isoformat(),
                "age_s": round(self.age.total_seconds(), 3), "expired": self.expired}


def record(store: ObjectStore, name: str, version: int, now: float) -> None:
    """Records that consumer ``name`` has taken the changes up to ``version``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"consumer {name!r}: version must be an int >= 0, got {version!r}")
    store.put(path_of(name), seal({"format_version": FORMAT_VERSION, "kind": "consumer",
                                   "name": name, "version": version,
                                   "updated_at": iso_of(now)}))


def recorded(store: ObjectStore, name: str) -> Optional[int]:
    """The version consumer ``name`` recorded, or None when there is no such consumer."""
    path = path_of(name)
    try:
        data = store.get(path)
    except FileNotFoundError:
        return None
    return _decode(data, f"{store.uri}/{path}")["version"]


def _decode(data: bytes, where: str) -> Dict[str, Any]:
    hint = "drop it with drop_consumer or `beam-supertable drop-consumer`"
    try:
        doc = unseal(data, where)
    except CorruptManifestError as exc:
        raise CorruptManifestError(f"{exc} ({hint})") from None
    if doc.get("kind") != "consumer" or isinstance(doc.get("version"), bool) \
            or not isinstance(doc.get("version"), int) or doc["version"] < 0 \
            or epoch_of(doc.get("updated_at")) is None:
        raise CorruptManifestError(f"{where}: not a consumer record ({hint})")
    return doc


def listing(store: ObjectStore, now: float, expiry_s: float,
            objects: Optional[Sequence[ObjectInfo]] = None, *,
            skip_unreadable: bool = False) -> List[Consumer]:
    """Every consumer of the table, by name (its object's), aged at ``now``.

    ``objects``: the table's listing when the caller has one (a consumer
    dropped since is skipped). ``skip_unreadable``: a record that is not one
    is logged and left out (vacuum's choice: no reader can resume from it, so
    it holds nothing) instead of raising ``CorruptManifestError``."""
    out = []
    for name, doc in named.read_all(store, CONSUMERS, _decode, objects,
                                    skip_unreadable=skip_unreadable, log=_LOG):
        at = epoch_of(doc["updated_at"])
        age = max(0.0, now - at)
        out.append(Consumer(name, doc["version"],
                            datetime.datetime.fromtimestamp(at, datetime.timezone.utc),
                            datetime.timedelta(seconds=age), age >= expiry_s))
    return sorted(out, key=lambda c: c.name)


def held_from(consumers: Sequence[Consumer], versions: Sequence[int]) -> Optional[int]:
    """The oldest version a live consumer still needs, among ``versions`` (those the
    table holds); None when no live consumer needs one. A consumer whose version
    is already gone holds nothing: it cannot resume from it anyway."""
    present = set(versions)
    needed = [c.version for c in consumers if not c.expired and c.version in present]
    return min(needed) if needed else None


def drop(store: ObjectStore, name: str) -> bool:
    """Removes consumer ``name``; False when there was none."""
    path = path_of(name)
    if not store.exists(path):
        return False
    store.delete(path)
    return True
