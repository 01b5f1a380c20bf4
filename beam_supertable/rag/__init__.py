"""Beam's RAG framework on a supertable: chunk ingestion and Enrichment search.

Beam's RAG toolkit (``apache_beam.ml.rag``) writes embedded ``Chunk`` s through a
``VectorDatabaseWriteConfig`` and retrieves neighbours through an
``EnrichmentSourceHandler`` given to ``apache_beam.transforms.enrichment.Enrichment``.
Every backend Beam ships needs a database server; a supertable needs none: an
object-store path is the whole database.

Example::

    config = SupertableVectorWriterConfig("s3://bucket/chunks", dimension=384)
    _ = embedded_chunks | config.create_write_transform()

    handler = SupertableSearchEnrichmentHandler("s3://bucket/chunks", k=5,
                                                mode="hybrid")
    answered = query_chunks | Enrichment(handler, join_fn=handler.join_fn)
    # each chunk's metadata["enrichment_data"] ==
    #   {"id": [...], "distance": [...], "fields": [{...}, ...]}

The chunk table (``chunk_schema``), one row per chunk:

=============  ===============================  ==================================
column         type                             holds
=============  ===============================  ==================================
``id``         string, not null                 ``chunk.id``
``content``    string                           ``chunk.content.text``; BM25 index
``embedding``  fixed_size_list<float32, dim>    the dense embedding; vector index
``metadata``   string, not null                 the rest of ``chunk.metadata`` as
                                                a JSON object (keys sorted; values
                                                JSON cannot hold become strings)
one per field  the field's type                 each of ``metadata_fields``,
                                                flattened out of the metadata so
                                                a filter can use it
=============  ===============================  ==================================

Filters are pyarrow expressions over these columns, so metadata a query must
filter on belongs in ``metadata_fields`` (``pc.field("lang") == "en"``).

The table is keyed by ``id`` and chunks are upserted, as Beam's other vector
writers do: re-ingesting a chunk replaces its row, and one chunk id is one
row. A bounded run is stamped once, at the wall-clock time it runs (or the
table's frontier if later), so each run replaces what earlier runs wrote;
copies of one id with different contents in one run go to the dead letters.
Unbounded input is ordered by the timestamps the stream carries. A chunk
table without a primary key (from earlier releases) is appended to, with a
warning; ``migrate_chunk_table(src, dst)`` copies it into a keyed table. See
``SupertableVectorWriterConfig``.

Beam versions: apache-beam 2.62 (the Flink environment) has the ``Chunk``
types and ``Enrichment`` but not ``VectorDatabaseWriteConfig`` (there the
config subclasses a local base with the same ``create_write_transform()``
contract) nor handler-supplied joins: its ``Enrichment`` ignores a handler's
``join_fn`` and calls ``_asdict()`` on requests and responses. Passing
``join_fn=handler.join_fn`` explicitly gives the same output on 2.62 and on
newer releases (where ``Enrichment(handler)`` alone also works).

Beam's ``Enrichment`` module imports google-api-core (apache-beam 2.62 also
google-cloud-aiplatform), which plain apache-beam does not install; where it
does not import, ``Enrichment`` here is None (``ENRICHMENT_IMPORT_ERROR`` says
why) and ``EnrichWithSupertable(handler)`` gives the same output.
"""

from beam_supertable.rag._common import (  # noqa: F401 - the public names
    _ENRICHMENT_TAKES_HANDLER_JOIN,
    CONTENT_COLUMN,
    DEFAULT_K,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_METRIC,
    DEFAULT_MIN_BATCH_SIZE,
    DEFAULT_REFRESH_EVERY_S,
    EMBEDDING_COLUMN,
    ENRICHMENT_IMPORT_ERROR,
    ENRICHMENT_KEY,
    ID_COLUMN,
    METADATA_COLUMN,
    MODES,
    NAMESPACE,
    ON_INVALID,
    RESERVED_COLUMNS,
    Chunk,
    Enrichment,
    EnrichmentSourceHandler,
    InvalidQueryError,
    SupertableError,
    chunk_schema,
    cross_join,
)
from beam_supertable.rag._keyed import migrate_chunk_table  # noqa: F401
from beam_supertable.rag.enrichment import (  # noqa: F401
    EnrichWithSupertable,
    SupertableSearchEnrichmentHandler,
    join_fn,
)
from beam_supertable.rag.ingestion import SupertableVectorWriterConfig  # noqa: F401

__all__ = [
    "CONTENT_COLUMN", "EMBEDDING_COLUMN", "ENRICHMENT_IMPORT_ERROR", "ENRICHMENT_KEY", "ID_COLUMN",
    "METADATA_COLUMN", "EnrichWithSupertable", "InvalidQueryError",
    "SupertableSearchEnrichmentHandler", "SupertableVectorWriterConfig", "chunk_schema", "join_fn",
    "migrate_chunk_table",
]


# Defined in private modules; public under this module's name (repr, pickles).
for _public in (InvalidQueryError, chunk_schema, EnrichWithSupertable,
                SupertableSearchEnrichmentHandler, SupertableVectorWriterConfig, join_fn,
                migrate_chunk_table):
    _public.__module__ = __name__
del _public
