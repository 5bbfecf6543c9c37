"""Where a collection keeps its vectors and keywords: one backend per file, chosen per
collection (``Collection.index_backend``; new collections take ``VECTOR_BACKEND``).

- :mod:`.faiss`: segment files under ``INDEX_DIR`` (one machine, or web nodes sharing it);
- :mod:`.milvus`: an engine (Milvus Lite, standalone or a cluster); nodes keep no files.

Both answer the same :class:`~apps.knowledge.backends.base.IndexBackend` contract, so
ingestion, search, ``index_check`` and ``reindex`` never ask which one they have.
"""

from __future__ import annotations

import functools

from django.utils.module_loading import import_string

from apps.knowledge.backends.base import Allowed, Drift, IndexBackend, chunk_texts
from apps.knowledge.models import Collection

BACKENDS = {
    "faiss": "apps.knowledge.backends.faiss.FaissBackend",
    "milvus": "apps.knowledge.backends.milvus.MilvusBackend",
}


@functools.cache
def index_backend(name: str) -> IndexBackend:
    """The process's backend called ``name`` (made once)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown index backend {name!r}: one of {sorted(BACKENDS)}")
    backend: IndexBackend = import_string(BACKENDS[name])()
    return backend


def backend_of(collection: Collection) -> IndexBackend:
    return index_backend(collection.index_backend)


__all__ = [
    "BACKENDS",
    "Allowed",
    "Drift",
    "IndexBackend",
    "backend_of",
    "chunk_texts",
    "index_backend",
]
