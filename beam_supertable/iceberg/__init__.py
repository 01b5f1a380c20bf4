"""The Iceberg v2 face of a supertable: metadata over the same Parquet objects.

- :mod:`.metadata`: the metadata of each version (table metadata, manifest
  lists, manifests, position delete files), written after each commit and
  repaired on demand;
- :mod:`.avro`: the manifest and manifest-list Avro files (fastavro);
- :mod:`.schema`: Arrow schemas as Iceberg schemas, with field ids.

It imports the storage layer (``format/``) and nothing above it. The storage
layer does not import it: importing this package registers the metadata as a
derived view (:mod:`beam_supertable.format.views`) of every manifest, so each
commit writes it and vacuum keeps what it needs.
"""

import warnings

from beam_supertable.format.views import register_view
from beam_supertable.iceberg import metadata as _metadata
from beam_supertable.iceberg.metadata import (
    ENABLED_PROPERTY, ENABLED_VALUE, METADATA, IcebergMetadata, is_enabled, metadata_path,
    referenced)

__all__ = ["ENABLED_PROPERTY", "ENABLED_VALUE", "METADATA", "IcebergMetadata", "is_enabled",
           "metadata_path", "referenced"]

register_view(IcebergMetadata.of)


def __getattr__(name):
    # ``beam_supertable.iceberg`` was the metadata module before it was a package.
    if name.startswith("__") or not hasattr(_metadata, name):
        raise AttributeError(f"module 'beam_supertable.iceberg' has no attribute {name!r}")
    warnings.warn(f"beam_supertable.iceberg.{name} moved to beam_supertable.iceberg.metadata; "
                  f"the old path goes in 0.4", DeprecationWarning, stacklevel=2)
    value = globals()[name] = getattr(_metadata, name)   # warned once
    return value


def __dir__():
    return sorted(set(globals()) | {n for n in dir(_metadata) if not n.startswith("_")})
