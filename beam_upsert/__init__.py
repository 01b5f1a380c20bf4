"""Upsert commands to a differential changelog, on Apache Beam.

See :class:`Upsert` for the row API and :class:`UpsertBatches` for the
columnar path over Arrow record batches.
"""

from beam_upsert.columnar import UpsertBatches, UpsertTableResult, batches_to_changes, upsert_table
from beam_upsert.model import Change, Invalid, UpsertCommand, UpsertError
from beam_upsert.transform import Upsert, UpsertResult

__all__ = [
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
