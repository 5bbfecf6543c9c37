"""The embedder and the index store for this process, and every write to an index.

A write appends: adding or deleting a document writes one small delta segment (the new
chunks' vectors and keyword postings, and the ids it deletes as tombstones), never the
collection's whole index. Writers hold the collection row (``select_for_update`` on
PostgreSQL; SQLite's IMMEDIATE transactions serialise writers), write the delta at
version + 1 atomically and move the row to it in the same transaction as the chunk
changes it reflects: a crash before the commit leaves an orphan file past the row's
version, which searches never read and the next write at that version replaces.

Compaction (a Celery task, past ``INDEX_COMPACT_DELTAS`` deltas or
``INDEX_COMPACT_TOMBSTONE_RATIO`` dead vectors, and on the beat) merges base and deltas
into a new base without holding the row: it builds from the state it read, then takes
the row only to publish, and only if no other compaction or rebuild has moved the base
meanwhile (deltas written meanwhile stay live after the new base).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F

from apps.knowledge.models import Chunk, Collection
from retrieval import (
    Embedder,
    EmbedderUnavailable,
    IndexCorrupted,
    IndexState,
    IndexStore,
    KeywordIndex,
    Segment,
    SegmentedIndex,
    VectorIndex,
    embedding_text,
    kind_for_size,
    load_embedder,
    remove_entry,
    set_search_threads,
)

logger = logging.getLogger(__name__)

COMPACT_TASK = "apps.knowledge.tasks.collection_index_compact_task"
# Up to this many chunk ids are fetched by key; more, by one pass over the collection
# (under every database's limit on query parameters).
APPEND_LOOKUP_LIMIT = 5_000


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
        str(settings.INDEX_DIR),
        dimension=settings.EMBEDDING_DIMENSION,
        policy=settings.VECTOR_INDEX_KIND,
        pq_m=settings.VECTOR_INDEX_PQ_M,
        cache_bytes=settings.INDEX_CACHE_BYTES,
    )


@functools.cache
def _index_store(
    root: str, *, dimension: int, policy: str, pq_m: int, cache_bytes: int
) -> IndexStore:
    set_search_threads(settings.FAISS_THREADS)
    return IndexStore(
        Path(root),
        dimension=dimension,
        policy=policy,  # type: ignore[arg-type]
        pq_m=pq_m,
        cache_bytes=cache_bytes,
    )


def index_state(collection: Collection) -> IndexState:
    return IndexState(base=collection.index_base, version=collection.index_version)


def vector_from_bytes(data: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype=np.float32)


def chunk_vectors(chunks: Iterable[Chunk]) -> tuple[np.ndarray, np.ndarray]:
    rows = [(chunk.pk, vector_from_bytes(chunk.embedding)) for chunk in chunks if chunk.embedding]
    dimension = settings.EMBEDDING_DIMENSION
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dimension), dtype=np.float32)
    ids = np.array([pk for pk, _ in rows], dtype=np.int64)
    return ids, np.vstack([vector for _, vector in rows]).astype(np.float32)


def collection_index_append(
    *, collection_id: int, ids: np.ndarray, vectors: np.ndarray, tombstones: np.ndarray
) -> Collection:
    """Append one delta: ``ids`` with their ``vectors`` (keywords from their database
    text), after deleting ``tombstones`` from everything before it.

    Call inside ``transaction.atomic`` together with the row changes the write reflects.
    A re-delivered add passes its ids as tombstones too, so they are never held twice.
    """
    collection = Collection.objects.select_for_update().get(pk=collection_id)
    store = index_store()
    delta = Segment(
        VectorIndex.build(store.dimension, "flat", ids=ids, vectors=vectors),
        keyword_index_build(collection_id=collection.pk, ids=ids),
        np.unique(np.asarray(tombstones, dtype=np.int64)),
    )
    version = collection.index_version + 1
    store.write_delta(collection.index_key, version, delta)
    Collection.objects.filter(pk=collection.pk).update(index_version=version)
    collection.index_version = version
    deltas = version - collection.index_base

    def published() -> None:
        # Cached only once current: a rolled-back version never answers a search here.
        store.remember(collection.index_key, "delta", version, segment=delta)
        if deltas >= settings.INDEX_COMPACT_DELTAS:
            current_app.signature(COMPACT_TASK, args=[collection.pk], immutable=True).apply_async()

    transaction.on_commit(published)
    return collection


def collection_index_load(collection: Collection) -> SegmentedIndex:
    """The collection's live index, as this process has it cached or reads it now.

    A base written before keyword postings existed (or whose keyword folder was lost)
    gets its keyword index built once from the database, for the chunks its vector file
    holds, as ``index_check --repair`` would: an upgrade needs no manual step.
    """
    store, state = index_store(), index_state(collection)
    try:
        return store.load(collection.index_key, state)
    except IndexCorrupted:
        base = store.path(collection.index_key, state.base)
        if not state.base or not base.exists():
            raise
        try:
            store.read_keywords(collection.index_key, state.base)
        except IndexCorrupted:
            logger.warning(
                "collection %s: no keyword index at version %s; building it from the database",
                collection.pk,
                state.base,
            )
            vectors = VectorIndex.read(base, dimension=store.dimension)
            keyword_index_build(collection_id=collection.pk, ids=vectors.ids()).write(
                store.keyword_path(collection.index_key, state.base)
            )
        return store.load(collection.index_key, state)


def collection_index_compact(*, collection_id: int, force: bool = False) -> bool:
    """Merge the collection's base and deltas into a new base; True when one was published.

    Without ``force``, only when due: ``INDEX_COMPACT_DELTAS`` deltas or more, or a share
    of dead vectors of ``INDEX_COMPACT_TOMBSTONE_RATIO`` or more.
    """
    collection = Collection.objects.filter(pk=collection_id).first()
    if collection is None or collection.index_version == collection.index_base:
        return False
    store, state = index_store(), index_state(collection)
    current = collection_index_load(collection)
    due = (
        len(state.deltas) >= settings.INDEX_COMPACT_DELTAS
        or current.tombstone_ratio >= settings.INDEX_COMPACT_TOMBSTONE_RATIO
    )
    if not (due or force):
        return False
    base = current.compact(
        policy=store.policy,
        pq_m=store.pq_m,
        exact_vectors=lambda ids: _stored_vectors(collection_id=collection_id, ids=ids),
    )
    store.write_base(collection.index_key, state.version, base)
    with transaction.atomic():
        row = Collection.objects.select_for_update().filter(pk=collection_id).first()
        moved = row is None or row.index_base != state.base or row.index_version < state.version
        written = store.path(collection.index_key, state.version).exists()
        if row is None:
            # Deleted while this built: its delete may have dropped the folder before the
            # new base was written into it, so what remains is this compaction's to remove.
            logger.info("collection %s: deleted during compaction", collection_id)
            store.drop(collection.index_key)
            return False
        if moved or not written:
            logger.info("collection %s: compaction to %s lost its race", collection_id, state)
            if row.index_base != state.version:
                remove_entry(store.path(collection.index_key, state.version))
                remove_entry(store.keyword_path(collection.index_key, state.version))
            return False
        Collection.objects.filter(pk=collection_id).update(index_base=state.version)

        def published() -> None:
            store.remember(collection.index_key, "base", state.version, segment=base)
            store.prune(collection.index_key, base_before=state.base)

        transaction.on_commit(published)
    return True


def _stored_vectors(*, collection_id: int, ids: np.ndarray) -> np.ndarray:
    """The vectors kept on the chunks ``ids``, in that order (one pass over the collection:
    there may be millions)."""
    position = {int(pk): n for n, pk in enumerate(ids)}
    vectors = np.zeros((len(ids), settings.EMBEDDING_DIMENSION), dtype=np.float32)
    rows = Chunk.objects.filter(collection_id=collection_id).values_list("pk", "embedding")
    for pk, embedding in rows.iterator(chunk_size=5000):
        if pk in position and embedding:
            vectors[position[pk]] = vector_from_bytes(embedding)
    return vectors


def collections_compact() -> int:
    """Compact every collection where it is due (the beat's sweep); returns how many."""
    pending = Collection.objects.filter(index_version__gt=F("index_base")).order_by("pk")
    return sum(
        collection_index_compact(collection_id=pk) for pk in pending.values_list("pk", flat=True)
    )


def collection_index_sweep(*, collection_id: int) -> list[Path]:
    """Delete the collection's orphan index files; under the row, so that no write (which
    holds it while its files are not yet named by the row) loses its files."""
    with transaction.atomic():
        collection = Collection.objects.select_for_update().get(pk=collection_id)
        orphans = index_store().orphans(collection.index_key, index_state(collection))
        for orphan in orphans:
            remove_entry(orphan)
    return orphans


def keyword_index_build(*, collection_id: int, ids: np.ndarray) -> KeywordIndex:
    """The BM25 index over the collection's chunks among ``ids``, from their database text.

    Each chunk is indexed as it is embedded (``embedding_text``: the document's title and
    the chunk's headings, then its text), so a title's words find its chunks too.
    """
    wanted = {int(pk) for pk in ids}
    rows = Chunk.objects.filter(collection_id=collection_id)
    if len(wanted) <= APPEND_LOOKUP_LIMIT:  # a delta's few chunks: looked up by key
        rows = rows.filter(pk__in=wanted)
    chunk_ids: list[int] = []
    texts: list[str] = []
    for pk, title, headings, text in (
        rows.order_by("pk")
        .values_list("pk", "document__title", "headings", "text")
        .iterator(chunk_size=2000)
    ):
        if pk in wanted:
            chunk_ids.append(pk)
            texts.append(embedding_text(title, tuple(headings), text))
    return KeywordIndex.build(chunk_ids, texts)


def collection_index_rebuild(*, collection_id: int) -> Collection:
    """Rebuild a collection's index as one new base: vectors from those kept on its chunks,
    keywords from their text."""
    with transaction.atomic():
        collection = Collection.objects.select_for_update().get(pk=collection_id)
        chunks = Chunk.objects.filter(collection_id=collection_id, document__status="indexed").only(
            "pk", "embedding"
        )
        ids, vectors = chunk_vectors(chunks)
        store = index_store()
        base = Segment(
            VectorIndex.build(
                store.dimension,
                kind_for_size(store.policy, len(ids)),
                ids=ids,
                vectors=vectors,
                pq_m=store.pq_m,
            ),
            keyword_index_build(collection_id=collection.pk, ids=ids),
        )
        previous, version = collection.index_base, collection.index_version + 1
        store.write_base(collection.index_key, version, base)
        Collection.objects.filter(pk=collection.pk).update(
            index_version=version, index_base=version
        )
        collection.index_version = collection.index_base = version

        def published() -> None:
            store.remember(collection.index_key, "base", version, segment=base)
            store.prune(collection.index_key, base_before=previous)

        transaction.on_commit(published)
        return collection
