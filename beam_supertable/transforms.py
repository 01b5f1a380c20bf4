"""The Beam transforms, by their historical module name.

``WriteToSupertable`` (and ``CommitResult``, ``WriteResult``) live in
:mod:`beam_supertable.write`, ``ReadFromSupertable`` in
:mod:`beam_supertable.read`; this module re-exports them so that
``from beam_supertable.transforms import ...`` keeps working.
"""

from beam_supertable.read import NAMESPACE, ReadFromSupertable  # noqa: F401
from beam_supertable.write import (  # noqa: F401
    DEFAULT_BATCH_ROWS, DEFAULT_COMMIT_EVERY_S, DEFAULT_GRID_SAMPLE_ROWS,
    DEFAULT_STREAMING_SHARDS, INVALID_TAG, METRICS, ON_INVALID, CommitResult,
    Metric, OnInvalid, WriteResult, WriteToSupertable)

__all__ = ["CommitResult", "ReadFromSupertable", "WriteResult", "WriteToSupertable"]

