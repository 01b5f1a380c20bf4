"""The Beam transforms over a supertable, and the stages they are built of.

- :mod:`.write`: ``WriteToSupertable`` (its stages in :mod:`.write_stages`,
  its checks in :mod:`.write_checks`);
- :mod:`.read`: ``ReadFromSupertable``; :mod:`.read_changes`:
  ``ReadChangesFromSupertable``, the change feed as a (tailing) source;
- :mod:`.upsert_write`: ``UpsertToSupertable``, upsert commands applied to a
  keyed table (:mod:`.upsert_validate`, :mod:`.upsert_apply`,
  :mod:`.upsert_commit` over :mod:`.upsert_table`);
- :mod:`.maintenance_stage`: the optimize and vacuum a writer runs on its
  own schedule.

These modules import apache_beam, the table layer (``table/``) and what lies
below it, and ``beam_upsert``; nothing here is imported by the layers below.
The names below are loaded on first use, so importing one stage does not
import every transform: ``from beam_supertable.transforms import
WriteToSupertable`` keeps working.
"""

import importlib

__all__ = ["CommitResult", "ReadChangesFromSupertable", "ReadFromSupertable",
           "UpsertToSupertable", "UpsertWriteResult", "WriteResult", "WriteToSupertable"]

_WRITE = "beam_supertable.transforms.write"
_CHECKS = "beam_supertable.transforms.write_checks"
_EXPORTS = {
    "CommitResult": _WRITE, "WriteResult": _WRITE, "WriteToSupertable": _WRITE,
    "DEFAULT_BATCH_ROWS": _WRITE, "DEFAULT_COMMIT_EVERY_S": _WRITE,
    "DEFAULT_GRID_SAMPLE_ROWS": _WRITE, "DEFAULT_STREAMING_SHARDS": _WRITE,
    "INVALID_TAG": _WRITE, "METRICS": _CHECKS, "ON_INVALID": _CHECKS, "Metric": _CHECKS,
    "OnInvalid": _CHECKS,
    "ReadFromSupertable": "beam_supertable.transforms.read",
    "NAMESPACE": "beam_supertable.transforms.read",
    "ReadChangesFromSupertable": "beam_supertable.transforms.read_changes",
    "UpsertToSupertable": "beam_supertable.transforms.upsert_write",
    "UpsertWriteResult": "beam_supertable.transforms.upsert_write",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'beam_supertable.transforms' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
