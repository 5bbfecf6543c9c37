"""Framework-free retrieval: parsing, token-aware chunking, embedding and FAISS indexes.

Nothing here imports Django; the apps call this package, never the reverse.
"""

from retrieval.chunking import Chunk, chunk_document, embedding_text
from retrieval.embedders import (
    Embedder,
    Embeddings,
    FakeEmbedder,
    SentenceTransformerEmbedder,
    default_model_path,
    load_embedder,
)
from retrieval.errors import (
    DocumentTooLarge,
    EmbedderUnavailable,
    IndexCorrupted,
    RetrievalError,
    UnsupportedDocument,
)
from retrieval.index import (
    Hit,
    IndexKind,
    IndexStore,
    VectorIndex,
    gpu_count,
    set_search_threads,
)
from retrieval.parsing import (
    Block,
    ParsedDocument,
    detect_media_type,
    parse_document,
    pdf_page_count,
)

__all__ = [
    "Block",
    "Chunk",
    "DocumentTooLarge",
    "Embedder",
    "EmbedderUnavailable",
    "Embeddings",
    "FakeEmbedder",
    "Hit",
    "IndexCorrupted",
    "IndexKind",
    "IndexStore",
    "ParsedDocument",
    "RetrievalError",
    "SentenceTransformerEmbedder",
    "UnsupportedDocument",
    "VectorIndex",
    "chunk_document",
    "default_model_path",
    "detect_media_type",
    "embedding_text",
    "gpu_count",
    "load_embedder",
    "parse_document",
    "pdf_page_count",
    "set_search_threads",
]
