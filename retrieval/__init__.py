"""Framework-free retrieval: parsing, token-aware chunking, embedding, FAISS and BM25
indexes, and their fusion.

Nothing here imports Django; the apps call this package, never the reverse.
"""

from retrieval.analysis import KeywordQuery, keyword_query, keyword_tokens
from retrieval.bm25 import BM25Parameters, KeywordSearcher
from retrieval.bounded import parse_document_bounded
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
from retrieval.fusion import (
    FUSION_DEPTH,
    FUSION_METHODS,
    RRF_K,
    FusionMethod,
    FusionPolicy,
    Normalised,
    fuse,
    fusion_depth,
    min_max_scores,
    normalised_score_fusion,
    reciprocal_rank_fusion,
    z_scores,
)
from retrieval.hits import Hit
from retrieval.index import (
    Ids,
    IndexKind,
    IndexPolicy,
    VectorIndex,
    Vectors,
    gpu_count,
    kind_for_size,
    set_search_threads,
)
from retrieval.keyword import KeywordIndex
from retrieval.parsing import (
    MEDIA_TYPES,
    Block,
    ParsedDocument,
    detect_media_type,
    parse_document,
    pdf_page_count,
)
from retrieval.segments import IndexState, Segment, SegmentedIndex
from retrieval.store import IndexStore, remove_entry

__all__ = [
    "FUSION_DEPTH",
    "FUSION_METHODS",
    "MEDIA_TYPES",
    "RRF_K",
    "BM25Parameters",
    "Block",
    "Chunk",
    "DocumentTooLarge",
    "Embedder",
    "EmbedderUnavailable",
    "Embeddings",
    "FakeEmbedder",
    "FusionMethod",
    "FusionPolicy",
    "Hit",
    "Ids",
    "IndexCorrupted",
    "IndexKind",
    "IndexPolicy",
    "IndexState",
    "IndexStore",
    "KeywordIndex",
    "KeywordQuery",
    "KeywordSearcher",
    "Normalised",
    "ParsedDocument",
    "RetrievalError",
    "Segment",
    "SegmentedIndex",
    "SentenceTransformerEmbedder",
    "UnsupportedDocument",
    "VectorIndex",
    "Vectors",
    "chunk_document",
    "default_model_path",
    "detect_media_type",
    "embedding_text",
    "fuse",
    "fusion_depth",
    "gpu_count",
    "keyword_query",
    "keyword_tokens",
    "kind_for_size",
    "load_embedder",
    "min_max_scores",
    "normalised_score_fusion",
    "parse_document",
    "parse_document_bounded",
    "pdf_page_count",
    "reciprocal_rank_fusion",
    "remove_entry",
    "set_search_threads",
    "z_scores",
]
