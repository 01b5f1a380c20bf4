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

from beam_supertable._moved import old_names
from beam_supertable.format.views import register_view
from beam_supertable.iceberg import metadata as _metadata
from beam_supertable.iceberg.metadata import (
    ENABLED_PROPERTY, ENABLED_VALUE, METADATA, IcebergMetadata, is_enabled, metadata_path,
    referenced)

__all__ = ["ENABLED_PROPERTY", "ENABLED_VALUE", "METADATA", "IcebergMetadata", "is_enabled",
           "metadata_path", "referenced"]

register_view(IcebergMetadata.of)


# ``beam_supertable.iceberg`` was the metadata module before it was a package.
__getattr__ = old_names(__name__, (_metadata.__name__,))

def __dir__():
    return sorted(set(globals()) | {n for n in dir(_metadata) if not n.startswith("_")})
