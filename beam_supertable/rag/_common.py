"""What ingestion and enrichment share: the chunk table's columns and schema,
and Beam's RAG and Enrichment types (with stand-ins where this Beam lacks them)."""

from __future__ import annotations

import contextlib
import inspect
from abc import ABC, abstractmethod
from typing import Any, Dict, Optional, Sequence

import apache_beam as beam
import pyarrow as pa

from beam_supertable.errors import SupertableError

try:
    from apache_beam.ml.rag.types import Chunk
except ImportError as exc:  # pragma: no cover - setup.py requires apache-beam >= 2.62
    raise ImportError(
        f"beam_supertable.rag needs apache-beam >= 2.62 (apache_beam.ml.rag.types): {exc}") from exc

try:
    from apache_beam.transforms.enrichment import Enrichment, EnrichmentSourceHandler, cross_join
    ENRICHMENT_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as exc:
    # Beam's Enrichment module imports google-api-core (apache-beam 2.62 also
    # google-cloud-aiplatform), which plain apache-beam does not install. The
    # handler still works where it is called directly (pipelines/search_supertable).
    ENRICHMENT_IMPORT_ERROR = exc
    Enrichment = None

    class EnrichmentSourceHandler(contextlib.AbstractContextManager):  # type: ignore[no-redef]
        """The interface of Beam's ``EnrichmentSourceHandler``, where Beam's cannot import."""

        def __exit__(self, exc_type, exc_val, exc_tb):
            return None

        def get_cache_key(self, request: Any) -> str:
            return f"request: {request}"

        def batch_elements_kwargs(self) -> Dict[str, int]:
            return {}

    def cross_join(left: Dict[str, Any], right: Dict[str, Any]) -> beam.Row:
        """Beam's ``cross_join``: the right row's fields join the left's (left wins)."""
        return beam.Row(**{**right, **left})


try:
    from apache_beam.ml.rag.ingestion.base import VectorDatabaseWriteConfig as _WriteConfigBase
except ImportError:  # apache-beam 2.62 has no ingestion package
    class _WriteConfigBase(ABC):  # type: ignore[no-redef]
        """Beam's ``VectorDatabaseWriteConfig`` contract, for releases without it."""

        @abstractmethod
        def create_write_transform(self) -> beam.PTransform:
            """A PTransform that writes a PCollection of Chunks."""


NAMESPACE = "beam_supertable.rag"
ID_COLUMN = "id"
CONTENT_COLUMN = "content"
EMBEDDING_COLUMN = "embedding"
METADATA_COLUMN = "metadata"
RESERVED_COLUMNS = (ID_COLUMN, CONTENT_COLUMN, EMBEDDING_COLUMN, METADATA_COLUMN)
ENRICHMENT_KEY = "enrichment_data"   # where Beam's vector-search handlers put results
DEFAULT_METRIC = "cosine"
DEFAULT_K = 3                        # Beam's Milvus handler's default limit
DEFAULT_MIN_BATCH_SIZE = 1
DEFAULT_MAX_BATCH_SIZE = 1000
DEFAULT_REFRESH_EVERY_S = 60.0
MODES = ("vector", "text", "hybrid", "auto")
ON_INVALID = ("dead_letter", "fail")

# Enrichment newer than apache-beam 2.62 takes the handler's join_fn and hands
# it the request and response objects themselves (use_custom_types).
_ENRICHMENT_TAKES_HANDLER_JOIN = Enrichment is None or "use_custom_types" in inspect.signature(
    Enrichment.__init__).parameters


class InvalidQueryError(SupertableError, ValueError):
    """An Enrichment request lacks what its search mode needs."""


def chunk_schema(dimension: int, metadata_fields: Sequence[pa.Field] = ()) -> pa.Schema:
    """The user schema of a chunk table (see the module docstring).

    Args:
        dimension: values per embedding.
        metadata_fields: metadata keys stored as their own (filterable) columns.
    """
    return pa.schema([
        pa.field(ID_COLUMN, pa.string(), nullable=False),
        pa.field(CONTENT_COLUMN, pa.string()),
        pa.field(EMBEDDING_COLUMN, pa.list_(pa.float32(), dimension), nullable=False),
        pa.field(METADATA_COLUMN, pa.string(), nullable=False),
        *metadata_fields,
    ])


def _text_of(chunk: Chunk) -> Optional[str]:
    content = chunk.content
    if content is None:
        return None
    if content.text is not None:
        return content.text
    image = getattr(content, "image", None)   # newer Beam: an image URI is storable text
    return image if isinstance(image, str) else None


def _dense_of(chunk: Chunk) -> Optional[list]:
    return chunk.embedding.dense_embedding if chunk.embedding is not None else None


def _metadata_value(chunk_id: str, field: pa.Field, value: Any) -> Any:
    try:
        pa.array([value], type=field.type)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ValueError(f"chunk {chunk_id!r}: metadata {field.name!r} = {value!r} is not "
                         f"{field.type} ({exc})") from exc
    return value
