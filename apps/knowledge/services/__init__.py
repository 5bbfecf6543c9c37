"""Writes for the knowledge app, one module per concern, re-exported here."""

from apps.knowledge.backends.faiss import (
    collection_index_compact,
    collection_index_load,
    collection_index_sweep,
    collections_compact,
    index_state,
    index_store,
)
from apps.knowledge.services.collections import collection_create, collection_delete
from apps.knowledge.services.dispatch import ingestion_enqueue
from apps.knowledge.services.documents import (
    Accepted,
    document_create_from_file,
    document_create_from_text,
    document_delete,
    document_reingest,
)
from apps.knowledge.services.embeddings import (
    EmbeddingBatch,
    embedding_model_name,
    embeddings_create,
)
from apps.knowledge.services.indexing import collection_index_rebuild, embedder
from apps.knowledge.services.ingestion import documents_requeue_stalled
from apps.knowledge.services.search import (
    DEFAULT_SEARCH_MODE,
    SEARCH_MODES,
    SearchFilters,
    SearchMode,
    SearchResult,
    chunk_search,
)
from apps.knowledge.services.stages import STAGE_FUNCTIONS, document_fail, document_ingest

__all__ = [
    "DEFAULT_SEARCH_MODE",
    "SEARCH_MODES",
    "STAGE_FUNCTIONS",
    "Accepted",
    "EmbeddingBatch",
    "SearchFilters",
    "SearchMode",
    "SearchResult",
    "chunk_search",
    "collection_create",
    "collection_delete",
    "collection_index_compact",
    "collection_index_load",
    "collection_index_rebuild",
    "collection_index_sweep",
    "collections_compact",
    "document_create_from_file",
    "document_create_from_text",
    "document_delete",
    "document_fail",
    "document_ingest",
    "document_reingest",
    "documents_requeue_stalled",
    "embedder",
    "embedding_model_name",
    "embeddings_create",
    "index_state",
    "index_store",
    "ingestion_enqueue",
]
