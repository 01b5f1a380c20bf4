"""Upsert commands to a differential changelog, on Apache Beam.

See :class:`Upsert` for the row API and :class:`UpsertBatches` for the
columnar path over Arrow record batches.
"""

# One version for the distribution; it is written in beam_supertable/_version.py.
from beam_supertable._version import __version__
from beam_upsert.columnar import UpsertBatches, UpsertTableResult, batches_to_changes, upsert_table
from beam_upsert.model import Change, Invalid, UpsertCommand, UpsertError
from beam_upsert.transform import Upsert, UpsertResult

__all__ = [
    "__version__",
    "Change",
    "Invalid",
    "Upsert",
    "UpsertBatches",
    "UpsertCommand",
    "UpsertError",
    "UpsertResult",
    "UpsertTableResult",
    "batches_to_changes",
    "upsert_table",
]
