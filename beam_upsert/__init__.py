"""Upsert commands to a differential changelog, on Apache Beam.

See :class:`Upsert` for the row API and :class:`UpsertBatches` for the
columnar path over Arrow record batches.
"""

from importlib import metadata as _metadata

from beam_upsert.columnar import UpsertBatches, UpsertTableResult, batches_to_changes, upsert_table
from beam_upsert.dead_letters import invalid_to_json
from beam_upsert.model import Change, Invalid, UpsertCommand, UpsertError
from beam_upsert.transform import Upsert, UpsertResult

try:
    # The distribution's version; read from its metadata so this package
    # imports nothing from beam_supertable, which ships beside it.
    __version__ = _metadata.version("beam-upsert-supertable")
except _metadata.PackageNotFoundError:   # run from a source tree that was never installed
    __version__ = "0+unknown"

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
    "invalid_to_json",
    "upsert_table",
]
