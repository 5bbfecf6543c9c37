"""FAISS and BM25 segment files under ``INDEX_DIR``: the embedded default.

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
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F

from apps.knowledge.backends.base import Allowed, Drift, chunk_texts, compare
from apps.knowledge.models import Chunk, Collection
from retrieval import (
    BM25Parameters,
    Hit,
    Ids,
    IndexCorrupted,
    IndexState,
    IndexStore,
    KeywordIndex,
    KeywordQuery,
    Segment,
    SegmentedIndex,
    VectorIndex,
    Vectors,
    kind_for_size,
    remove_entry,
    set_search_threads,
)

logger = logging.getLogger(__name__)

COMPACT_TASK = "apps.knowledge.tasks.collection_index_compact_task"


class FaissBackend:
    name: ClassVar[str] = "faiss"
    segmented: ClassVar[bool] = True

    def append(
        self, collection: Collection, *, version: int, ids: Ids, vectors: Vectors, tombstones: Ids
    ) -> None:
        store = index_store()
        delta = Segment(
            VectorIndex.build(store.dimension, "flat", ids=ids, vectors=vectors),
            keyword_index_build(collection_id=collection.pk, ids=ids),
            np.unique(np.asarray(tombstones, dtype=np.int64)),
        )
        store.write_delta(collection.index_key, version, delta)
        deltas = version - collection.index_base

        def published() -> None:
            # Cached only once current: a rolled-back version never answers a search here.
            store.remember(collection.index_key, "delta", version, segment=delta)
            if deltas >= settings.INDEX_COMPACT_DELTAS:
                signature = current_app.signature(
                    COMPACT_TASK, args=[collection.pk], immutable=True
                )
                signature.apply_async()

        transaction.on_commit(published)

    def rebuild(self, collection: Collection, *, version: int, ids: Ids, vectors: Vectors) -> None:
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
        previous = collection.index_base
        store.write_base(collection.index_key, version, base)

        def published() -> None:
            store.remember(collection.index_key, "base", version, segment=base)
            store.prune(collection.index_key, base_before=previous)

        transaction.on_commit(published)

    def drop(self, *, team_id: int, collection_id: int) -> None:
        index_store().drop(str(collection_id))

    def dense_search(
        self, collections: Sequence[Collection], query: Vectors, k: int, allowed: Allowed | None
    ) -> list[Hit]:
        hits: list[Hit] = []
        for collection in collections:
            subset = None if allowed is None else allowed.chunks_of(collection.pk)
            hits.extend(_loaded(collection).search(query, k, allowed=subset)[0])
        return hits

    def keyword_search(
        self,
        collections: Sequence[Collection],
        query: KeywordQuery,
        k: int,
        allowed: Allowed | None,
        parameters: BM25Parameters,
    ) -> list[Hit]:
        hits: list[Hit] = []
        for collection in collections:
            subset = None if allowed is None else allowed.chunks_of(collection.pk)
            index = _loaded(collection)
            hits.extend(index.keyword_search(query, k, allowed=subset, parameters=parameters))
        return hits

    def drift(self, collection: Collection, expected: set[int]) -> Drift:
        store, state = index_store(), index_state(collection)
        orphans = len(store.orphans(collection.index_key, state))
        try:
            live = store.read_state(collection.index_key, state)
        except IndexCorrupted as exc:
            return Drift(f"unreadable ({exc})", f"unreadable ({exc})", orphans)
        return Drift(compare(live.ids(), expected), compare(_keyword_ids(live), expected), orphans)

    def sweep(self, collection: Collection) -> int:
        return len(collection_index_sweep(collection_id=collection.pk))

    def leftovers(self, live: Sequence[Collection], *, repair: bool) -> int:
        root = index_store().root
        folders = {p.name: p for p in root.iterdir() if p.is_dir()} if root.is_dir() else {}
        keys = {c.index_key for c in live if c.index_backend == self.name}
        unknown = [int(name) for name in folders if name not in keys and name.isdigit()]
        # Read again now: a collection made since ``live`` was read keeps its folder.
        current = Collection.objects.filter(pk__in=unknown, index_backend=self.name)
        stale = set(unknown) - set(current.values_list("pk", flat=True))
        if repair:
            for pk in stale:
                remove_entry(folders[str(pk)])
        return len(stale)


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


def keyword_index_build(*, collection_id: int, ids: Ids) -> KeywordIndex:
    """The BM25 index over the collection's chunks among ``ids``, from their database text."""
    chunks = chunk_texts(collection_id=collection_id, ids=ids)
    return KeywordIndex.build([int(pk) for pk in chunks.ids], chunks.texts)


def _loaded(collection: Collection) -> SegmentedIndex:
    try:
        return collection_index_load(collection)
    except IndexCorrupted:
        # A compaction since this request read the row may have pruned its segments.
        collection.refresh_from_db(fields=["index_base", "index_version"])
        return collection_index_load(collection)


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
    collection = Collection.objects.filter(pk=collection_id, index_backend="faiss").first()
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
    return _compaction_publish(collection, state, base)


def _compaction_publish(collection: Collection, state: IndexState, base: Segment) -> bool:
    """Move the row to the new base, unless the collection moved or went meanwhile."""
    store, collection_id = index_store(), collection.pk
    with transaction.atomic():
        row = Collection.objects.select_for_update().filter(pk=collection_id).first()
        written = store.path(collection.index_key, state.version).exists()
        if row is None:
            # Deleted while this built: its delete may have dropped the folder before the
            # new base was written into it, so what remains is this compaction's to remove.
            logger.info("collection %s: deleted during compaction", collection_id)
            store.drop(collection.index_key)
            return False
        moved = (
            row.index_backend != FaissBackend.name
            or row.index_base != state.base
            or row.index_version < state.version
        )
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
            vectors[position[pk]] = np.frombuffer(bytes(embedding), dtype=np.float32)
    return vectors


def collections_compact() -> int:
    """Compact every collection where it is due (the beat's sweep); returns how many."""
    pending = Collection.objects.filter(
        index_backend=FaissBackend.name, index_version__gt=F("index_base")
    ).order_by("pk")
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


def _keyword_ids(index: SegmentedIndex) -> Ids:
    """The ids the keyword side holds live (each segment's postings minus its dead)."""
    parts = [
        ids[~np.isin(ids, dead)]
        for ids, dead in (
            (segment.keywords.ids(), dead)
            for segment, dead in zip(index.segments, index.dead, strict=True)
        )
    ]
    return np.concatenate(parts)
