"""Retrieval without generation: search the caller's indexes by meaning, by words, or both.

``hybrid`` (the default everywhere) fuses the dense (FAISS, MiniLM) and keyword (BM25)
rankings as ``SEARCH_FUSION`` says (reciprocal ranks or normalised scores, see
:mod:`retrieval.fusion`); ``dense`` and ``keyword`` run one of them alone. Only
the dense part embeds the query, so only it is charged: keyword search costs no tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
from django.conf import settings
from django.db import transaction

from apps.accounts.selectors import Caller
from apps.knowledge.backends import Allowed, IndexBackend, backend_of
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.selectors import collection_list_readable
from apps.knowledge.services.indexing import embedder
from apps.usage.budgets import budget_reserve, budget_settle, limits_cache
from apps.usage.models import UsageRecord
from apps.usage.services import embedding_cost, usage_record_embedding
from retrieval import BM25Parameters, FusionPolicy, Hit, fuse, fusion_depth, keyword_query

logger = logging.getLogger(__name__)

SNIPPET_CHARS = 300

SearchMode = Literal["hybrid", "dense", "keyword"]
SEARCH_MODES: tuple[SearchMode, ...] = ("hybrid", "dense", "keyword")
DEFAULT_SEARCH_MODE: SearchMode = "hybrid"


@dataclass(frozen=True)
class SearchResult:
    chunk: Chunk
    score: float

    @property
    def snippet(self) -> str:
        text = " ".join(self.chunk.text.split())
        return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1].rstrip() + "…"


@dataclass(frozen=True)
class SearchFilters:
    """Metadata a chunk must match to be searched at all; every filter given must hold.

    ``document_ids``: chunks of these documents; ``titles``: chunks of documents with one of
    these titles (exact). A filter naming another team's document matches nothing.
    """

    document_ids: tuple[int, ...] | None = None
    titles: tuple[str, ...] | None = None

    @property
    def empty(self) -> bool:
        return self.document_ids is None and self.titles is None


def chunk_search(
    *,
    caller: Caller,
    query: str,
    collection_ids: list[int] | None = None,
    top_k: int = 5,
    mode: SearchMode = DEFAULT_SEARCH_MODE,
    filters: SearchFilters | None = None,
) -> list[SearchResult]:
    """The ``top_k`` best chunks for ``query`` among the collections the caller may read.

    Isolation holds before ranking: only the caller's team's indexes are searched at all,
    and filters select among the team's own chunks (read from the database) inside each
    index's search, before either list is cut or fused. ``score`` is the cosine
    similarity (``dense``), the BM25 score (``keyword``) or the fused score (``hybrid``:
    reciprocal ranks or normalised scores, each document's best chunk carrying the
    document's, :func:`fusion_policy`). The query's embedding
    tokens (``dense``, ``hybrid``) are charged to the team.
    """
    if mode not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {mode!r}")
    collections = [
        collection
        for collection in collection_list_readable(team=caller.team, ids=collection_ids)
        if collection.index_version
    ]
    allowed = _allowed_chunks(caller=caller, collections=collections, filters=filters)
    if allowed is not None:
        collections = [c for c in collections if len(allowed.chunks_of(c.pk))]
    policy = fusion_policy()
    # A single mode reads deeper than it returns too: room for hits the database no longer
    # calls returnable (an engine row outliving its chunk) without coming up short.
    depth = fusion_depth(top_k, policy.depth) if mode == "hybrid" else max(2 * top_k, 20)
    rankings: list[list[Hit]] = []
    if mode != "keyword":
        rankings.append(
            _dense_search(
                caller=caller, query=query, collections=collections, allowed=allowed, k=depth
            )
        )
    if mode != "dense":
        rankings.append(
            _keyword_search(query=query, collections=collections, allowed=allowed, k=depth)
        )
    ranked = (
        fuse(
            rankings[0],
            rankings[1],
            policy=policy,
            documents=_documents_of(rankings) if policy.by_document else None,
        )
        if mode == "hybrid"
        else rankings[0]
    )
    return _first_returnable(ranked, team_id=caller.team.pk, top_k=top_k)


def _documents_of(rankings: list[list[Hit]]) -> dict[int, int]:
    """Each listed chunk's document, to fuse by document. The ids come from the caller's
    own indexes; a chunk deleted since is absent, and fuses as a document of its own."""
    ids = {hit.id for ranking in rankings for hit in ranking}
    return dict(Chunk.objects.filter(pk__in=ids).values_list("pk", "document_id"))


def _first_returnable(hits: list[Hit], *, team_id: int, top_k: int) -> list[SearchResult]:
    """The first ``top_k`` of ``hits`` whose chunks may be returned, read from the database
    a slice at a time. A chunk deleted since the index was read is skipped, as is one not
    (or no longer) indexed; never another team's."""
    results: list[SearchResult] = []
    step, read = max(2 * top_k, 10), 0
    while len(results) < top_k and read < len(hits):
        window, read = hits[read : read + step], read + step
        chunks = Chunk.objects.select_related("document").in_bulk([hit.id for hit in window])
        results.extend(
            SearchResult(chunks[hit.id], hit.score)
            for hit in window
            if hit.id in chunks and _returnable(chunks[hit.id], team_id=team_id)
        )
    if skipped := min(read, len(hits)) - len(results):
        logger.info("search: %d hit(s) not returnable (index_check --repair)", skipped)
    return results[:top_k]


def _returnable(chunk: Chunk, *, team_id: int) -> bool:
    document = chunk.document
    return document.team_id == team_id and document.status == Document.Status.INDEXED


def fusion_policy() -> FusionPolicy:
    """How hybrid search fuses its lists: ``SEARCH_FUSION``, ``SEARCH_FUSION_ALPHA``,
    ``SEARCH_FUSION_DEPTH`` and ``SEARCH_FUSION_BY_DOCUMENT`` (read per search, so a
    settings override applies at once)."""
    return FusionPolicy(
        method=settings.SEARCH_FUSION,
        alpha=settings.SEARCH_FUSION_ALPHA,
        depth=settings.SEARCH_FUSION_DEPTH,
        by_document=bool(settings.SEARCH_FUSION_BY_DOCUMENT),
    )


def bm25_parameters() -> BM25Parameters:
    """BM25's k1 and b for keyword search: ``KEYWORD_BM25_K1``, ``KEYWORD_BM25_B``."""
    return BM25Parameters(k1=settings.KEYWORD_BM25_K1, b=settings.KEYWORD_BM25_B)


def _allowed_chunks(
    *, caller: Caller, collections: list[Collection], filters: SearchFilters | None
) -> Allowed | None:
    """The chunks (and their documents) each collection may return under ``filters``;
    None: no filter."""
    if filters is None or filters.empty:
        return None
    chunks = Chunk.objects.filter(
        collection__in=collections,
        document__team=caller.team,
        document__status=Document.Status.INDEXED,
    )
    if filters.document_ids is not None:
        chunks = chunks.filter(document_id__in=filters.document_ids)
    if filters.titles is not None:
        chunks = chunks.filter(document__title__in=filters.titles)
    by_collection: dict[int, list[int]] = {}
    documents: dict[int, set[int]] = {}
    rows = chunks.order_by().values_list("collection_id", "pk", "document_id")
    for collection_id, pk, document_id in rows:
        by_collection.setdefault(collection_id, []).append(pk)
        documents.setdefault(collection_id, set()).add(document_id)
    return Allowed(
        chunks={key: np.asarray(ids, dtype=np.int64) for key, ids in by_collection.items()},
        documents={key: np.asarray(sorted(ids), dtype=np.int64) for key, ids in documents.items()},
    )


def _dense_search(
    *,
    caller: Caller,
    query: str,
    collections: list[Collection],
    allowed: Allowed | None,
    k: int,
) -> list[Hit]:
    """Embed the query (charged) and search each collection's vector index."""
    model = embedder()
    # Held before embedding, like every other token: a team past its quota gets its 429
    # here, not free compute; settled to the exact count once the search has succeeded.
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key, tag=caller.tag)
    tokens = model.count_embedding_tokens([query])
    reservation = (
        budget_reserve(
            team=caller.team,
            api_key=caller.api_key,
            tokens=tokens,
            cost=embedding_cost(model=model.model_name, tokens=tokens),
            kind=UsageRecord.Kind.EMBEDDING,
            limits=limits,
        )
        if limits
        else None
    )
    try:
        embedded = model.embed([query])
        hits = [
            hit
            for backend, group in _by_backend(collections)
            for hit in backend.dense_search(group, embedded.vectors, k, allowed)
        ]
    except BaseException:
        if reservation is not None:
            budget_settle(reservation=reservation, actual=0)  # a failed search costs nothing
        raise
    with transaction.atomic():  # the settlement and its ledger row, together
        if reservation is not None:
            cost = embedding_cost(model=model.model_name, tokens=embedded.token_count)
            budget_settle(reservation=reservation, actual=embedded.token_count, cost=cost)
        usage_record_embedding(
            team=caller.team,
            model=model.model_name,
            tokens=embedded.token_count,
            operation="query",
            api_key=caller.api_key,
            user=caller.user,
            tag=caller.tag,
        )
    hits.sort(key=lambda hit: (-hit.score, hit.id))
    return hits[:k]


def _keyword_search(
    *, query: str, collections: list[Collection], allowed: Allowed | None, k: int
) -> list[Hit]:
    """Search each collection's BM25 index; no model runs, nothing is charged. The query
    is analysed once, its distinct terms capped (``KEYWORD_MAX_QUERY_TERMS``)."""
    terms = keyword_query(query, max_terms=settings.KEYWORD_MAX_QUERY_TERMS)
    parameters = bm25_parameters()
    hits = [
        hit
        for backend, group in _by_backend(collections)
        for hit in backend.keyword_search(group, terms, k, allowed, parameters)
    ]
    hits.sort(key=lambda hit: (-hit.score, hit.id))
    return hits[:k]


def _by_backend(collections: list[Collection]) -> list[tuple[IndexBackend, list[Collection]]]:
    """The collections grouped by where their indexes live (one search per engine)."""
    groups: dict[str, list[Collection]] = {}
    for collection in collections:
        groups.setdefault(collection.index_backend, []).append(collection)
    return [(backend_of(group[0]), group) for group in groups.values()]
