"""Retrieval without generation: embed the query, search the caller's indexes, rank."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from apps.accounts.selectors import Caller
from apps.knowledge.models import Chunk, Collection
from apps.knowledge.selectors import collection_list_readable
from apps.knowledge.services.indexing import embedder, index_store
from apps.usage.budgets import budget_reserve, budget_settle, limits_of
from apps.usage.models import UsageRecord
from apps.usage.services import usage_record_embedding
from retrieval import Hit, IndexCorrupted, VectorIndex

logger = logging.getLogger(__name__)

SNIPPET_CHARS = 300


@dataclass(frozen=True)
class SearchResult:
    chunk: Chunk
    score: float

    @property
    def snippet(self) -> str:
        text = " ".join(self.chunk.text.split())
        return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1].rstrip() + "…"


def chunk_search(
    *, caller: Caller, query: str, collection_ids: list[int] | None = None, top_k: int = 5
) -> list[SearchResult]:
    """The ``top_k`` chunks closest to ``query`` among the collections the caller may read.

    Isolation holds before ranking: only the caller's team's indexes are searched at all.
    The query's embedding tokens are charged to the team.
    """
    collections = collection_list_readable(team=caller.team, ids=collection_ids)
    model = embedder()
    # Held before embedding, like every other token: a team past its quota gets its 429
    # here, not free compute; settled to the exact count once the search has succeeded.
    limits = list(limits_of(team=caller.team, api_key=caller.api_key))
    reservation = (
        budget_reserve(
            team=caller.team,
            api_key=caller.api_key,
            tokens=model.count_embedding_tokens([query]),
            kind=UsageRecord.Kind.EMBEDDING,
            limits=limits,
        )
        if limits
        else None
    )
    try:
        embedded = model.embed([query])
        hits: list[Hit] = []
        for collection in collections:
            if collection.index_version:
                hits.extend(_index_for(collection).search(embedded.vectors, top_k)[0])
    except BaseException:
        if reservation is not None:
            budget_settle(reservation=reservation, actual=0)  # a failed search costs nothing
        raise
    with transaction.atomic():  # the settlement and its ledger row, together
        if reservation is not None:
            budget_settle(reservation=reservation, actual=embedded.token_count)
        usage_record_embedding(
            team=caller.team,
            model=model.model_name,
            tokens=embedded.token_count,
            operation="query",
            api_key=caller.api_key,
            user=caller.user,
        )
    hits.sort(key=lambda hit: hit.score, reverse=True)
    best = hits[:top_k]
    chunks = Chunk.objects.select_related("document").in_bulk([hit.id for hit in best])
    return [
        SearchResult(chunks[hit.id], hit.score)
        for hit in best
        # A chunk deleted since the index was read is skipped, never another team's.
        if hit.id in chunks and chunks[hit.id].document.team_id == caller.team.pk
    ]


def _index_for(collection: Collection) -> VectorIndex:
    store = index_store()
    try:
        return store.load(collection.index_key, collection.index_version)
    except IndexCorrupted:
        # Two writes since this request read the row may have pruned its version.
        collection.refresh_from_db(fields=["index_version"])
        return store.load(collection.index_key, collection.index_version)
