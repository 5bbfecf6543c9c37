"""The embedder and the index store for this process, and every write to an index.

Writes to a collection's index happen with the collection row locked
(``select_for_update`` on PostgreSQL; SQLite's IMMEDIATE transactions serialise writers),
read the current version, write version + 1 atomically and move the row to it in the same
transaction as the chunk changes they reflect.

Each version is a pair: the FAISS file and the BM25 keyword index. The keyword index is
rebuilt from the database's chunk texts for exactly the chunk ids the new vector index
holds (bm25s has no incremental add), so the two always cover the same chunks, and a
crash anywhere leaves the row on a version whose pair was completely written.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction

from apps.knowledge.models import Chunk, Collection
from retrieval import (
    Embedder,
    EmbedderUnavailable,
    IndexStore,
    KeywordIndex,
    VectorIndex,
    embedding_text,
    load_embedder,
    set_search_threads,
)

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


def index_store() -> IndexStore:
    return _index_store(
        str(settings.INDEX_DIR), settings.EMBEDDING_DIMENSION, settings.VECTOR_INDEX_KIND
    )


@functools.cache
def _index_store(root: str, dimension: int, kind: str) -> IndexStore:
    set_search_threads(settings.FAISS_THREADS)
    return IndexStore(root, dimension=dimension, kind=kind)  # type: ignore[arg-type]


def vector_from_bytes(data: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype=np.float32)


def chunk_vectors(chunks: Iterable[Chunk]) -> tuple[np.ndarray, np.ndarray]:
    rows = [(chunk.pk, vector_from_bytes(chunk.embedding)) for chunk in chunks if chunk.embedding]
    dimension = settings.EMBEDDING_DIMENSION
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dimension), dtype=np.float32)
    ids = np.array([pk for pk, _ in rows], dtype=np.int64)
    return ids, np.vstack([vector for _, vector in rows]).astype(np.float32)


def collection_index_write(
    *, collection_id: int, mutate: Callable[[VectorIndex], None], from_scratch: bool = False
) -> Collection:
    """Apply ``mutate`` to a copy of the collection's index and publish it as a new version.

    Call inside ``transaction.atomic`` together with the row changes the write reflects.
    ``from_scratch`` starts from an empty index instead of the current (maybe lost) one.
    """
    collection = Collection.objects.select_for_update().get(pk=collection_id)
    store = index_store()
    version = 0 if from_scratch else collection.index_version
    index = store.load_copy(collection.index_key, version)
    mutate(index)
    keyword = keyword_index_build(collection_id=collection.pk, ids=index.ids())
    version = collection.index_version + 1
    store.save(collection.index_key, version, index, keyword=keyword, cache=False)
    Collection.objects.filter(pk=collection.pk).update(index_version=version)
    collection.index_version = version

    def published() -> None:
        # Cached only once current: a rolled-back version never answers a search here.
        store.remember(collection.index_key, version, index, keyword)
        # One version stays behind for searches that read the row just before this commit.
        store.prune(collection.index_key, keep_from=version - 1)

    transaction.on_commit(published)
    return collection


def keyword_index_build(*, collection_id: int, ids: np.ndarray) -> KeywordIndex:
    """The BM25 index over the collection's chunks among ``ids``, from their database text.

    Each chunk is indexed as it is embedded (``embedding_text``: the document's title and
    the chunk's headings, then its text), so a title's words find its chunks too.
    """
    wanted = {int(pk) for pk in ids}
    rows = (
        Chunk.objects.filter(collection_id=collection_id)
        .order_by("pk")
        .values_list("pk", "document__title", "headings", "text")
    )
    chunk_ids: list[int] = []
    texts: list[str] = []
    for pk, title, headings, text in rows.iterator(chunk_size=2000):
        if pk in wanted:
            chunk_ids.append(pk)
            texts.append(embedding_text(title, tuple(headings), text))
    return KeywordIndex.build(chunk_ids, texts)


def collection_index_rebuild(*, collection_id: int) -> Collection:
    """Rebuild a collection's indexes: vectors from those kept on its chunks, keywords from
    their text."""
    with transaction.atomic():
        chunks = Chunk.objects.filter(collection_id=collection_id, document__status="indexed").only(
            "pk", "embedding"
        )
        ids, vectors = chunk_vectors(chunks)

        return collection_index_write(
            collection_id=collection_id,
            mutate=lambda index: index.add(ids, vectors),
            from_scratch=True,
        )
