"""The embedder for this process, and every write to a collection's index.

Writers hold the collection row (``select_for_update`` on PostgreSQL; SQLite's IMMEDIATE
transactions serialise writers) and move ``index_version`` in the same transaction as the
chunk changes the write reflects; where the index lives is the collection's backend's
business (:mod:`apps.knowledge.backends`: FAISS segment files, or a Milvus engine).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction

from apps.knowledge.backends import backend_of, index_backend
from apps.knowledge.models import Chunk, Collection, Document
from retrieval import Embedder, EmbedderUnavailable, Ids, Vectors, load_embedder

logger = logging.getLogger(__name__)


def embedder() -> Embedder:
    """The process's embedder, loaded on first use (never at import or in ``ready()``)."""
    return _embedder(settings.EMBEDDER_BACKEND, tuple(sorted(settings.EMBEDDER_OPTIONS.items())))


@functools.cache
def _embedder(backend: str, options: tuple[tuple[str, Any], ...]) -> Embedder:
    model = load_embedder(backend, **dict(options))
    if model.dimension != settings.EMBEDDING_DIMENSION:
        raise EmbedderUnavailable(
            f"{model.model_name} makes {model.dimension}-dimensional vectors; set "
            f"EMBEDDING_DIMENSION={model.dimension} (and rebuild indexes: index_check --repair)."
        )
    return model


def vector_from_bytes(data: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype=np.float32)


def chunk_vectors(chunks: Iterable[Chunk]) -> tuple[Ids, Vectors]:
    rows = [(chunk.pk, vector_from_bytes(chunk.embedding)) for chunk in chunks if chunk.embedding]
    dimension = settings.EMBEDDING_DIMENSION
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dimension), dtype=np.float32)
    ids = np.array([pk for pk, _ in rows], dtype=np.int64)
    return ids, np.vstack([vector for _, vector in rows]).astype(np.float32)


def collection_index_append(
    *, collection_id: int, ids: Ids, vectors: Vectors, tombstones: Ids
) -> Collection:
    """Add ``ids`` with their ``vectors`` (keywords from their database text), after
    deleting ``tombstones`` from everything before.

    Call inside ``transaction.atomic`` together with the row changes the write reflects.
    A re-delivered add passes its ids as tombstones too, so they are never held twice.
    """
    collection = Collection.objects.select_for_update().get(pk=collection_id)
    version = collection.index_version + 1
    backend = backend_of(collection)
    backend.append(collection, version=version, ids=ids, vectors=vectors, tombstones=tombstones)
    _publish(collection, version=version, rebuilt=not backend.segmented)
    return collection


def collection_index_rebuild(*, collection_id: int, backend: str | None = None) -> Collection:
    """Rebuild a collection's index whole from what its indexed chunks keep (vectors and
    text), in ``backend`` (None: where it is now); the row moves to it in the same step,
    so searches read the old index until the new one is complete."""
    with transaction.atomic():
        collection = Collection.objects.select_for_update().get(pk=collection_id)
        chunks = Chunk.objects.filter(
            collection_id=collection_id, document__status=Document.Status.INDEXED
        ).only("pk", "embedding")
        ids, vectors = chunk_vectors(chunks)
        version = collection.index_version + 1
        collection.index_backend = backend or collection.index_backend
        index_backend(collection.index_backend).rebuild(
            collection, version=version, ids=ids, vectors=vectors
        )
        _publish(collection, version=version, rebuilt=True)
        return collection


def _publish(collection: Collection, *, version: int, rebuilt: bool) -> None:
    """Move the row to ``version`` (and its base too, when the whole index was made anew)."""
    fields: dict[str, Any] = {"index_version": version, "index_backend": collection.index_backend}
    if rebuilt:
        fields["index_base"] = version
    Collection.objects.filter(pk=collection.pk).update(**fields)
    for field, value in fields.items():
        setattr(collection, field, value)
