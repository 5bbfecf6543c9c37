"""Framework-free retrieval: parsing, token-aware chunking, embedding, FAISS and BM25
indexes, and their fusion.

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
from retrieval.fusion import FUSION_DEPTH, RRF_K, fusion_depth, reciprocal_rank_fusion
from retrieval.hits import Hit
from retrieval.index import (
    IndexKind,
    IndexStore,
    VectorIndex,
    gpu_count,
    set_search_threads,
)
from retrieval.keyword import KeywordIndex, keyword_tokens
from retrieval.parsing import (
    MEDIA_TYPES,
    Block,
    ParsedDocument,
    detect_media_type,
    parse_document,
    pdf_page_count,
)

__all__ = [
    "FUSION_DEPTH",
    "MEDIA_TYPES",
    "RRF_K",
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
    "KeywordIndex",
    "ParsedDocument",
    "RetrievalError",
    "SentenceTransformerEmbedder",
    "UnsupportedDocument",
    "VectorIndex",
    "chunk_document",
    "default_model_path",
    "detect_media_type",
    "embedding_text",
    "fusion_depth",
    "gpu_count",
    "keyword_tokens",
    "load_embedder",
    "parse_document",
    "pdf_page_count",
    "reciprocal_rank_fusion",
    "set_search_threads",
]
