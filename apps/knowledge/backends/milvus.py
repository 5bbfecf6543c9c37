"""Chunks in a Milvus engine (:mod:`retrieval.milvus`): no index files on any node.

One engine collection per embedding model (``MILVUS_COLLECTION_PREFIX``, the model, its
dimension) holds every team's chunks, partitioned by team and collection; each search
names the team's collections and the team itself inside the engine, and the search
service checks each returned chunk's team again.

Writes follow the database transaction they belong to. Adds are upserts made before the
commit: a rolled-back write leaves chunks the database does not call indexed, which the
search service never returns (it keeps only chunks of indexed documents) and which the
next delivery writes again without doubling them. Deletes are made after the commit, so
a rolled-back delete takes nothing out; a delete the engine misses leaves ids whose rows
are gone (never returned). ``index_check --repair`` mends both kinds of drift.

An engine out of reach, restarting or throttling raises
:class:`~apps.knowledge.backends.base.IndexUnavailable`, a transient error: the index
stage's task retries it rather than fail the document, and a search answers 503
``index_unavailable`` with ``Retry-After`` (nothing charged) rather than 500.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

import grpc  # type: ignore[import-untyped]  # no stubs; pymilvus raises its errors
import numpy as np
from django.conf import settings
from django.db import transaction
from pymilvus import MilvusException
from pymilvus.exceptions import ConnectError, ErrorCode, MilvusUnavailableException

from apps.knowledge.backends.base import Allowed, Drift, IndexUnavailable, chunk_texts, compare
from apps.knowledge.models import Collection
from retrieval import BM25Parameters, Hit, Ids, KeywordQuery, Vectors
from retrieval.milvus import MilvusIndex, MilvusRows, Scope, Where

logger = logging.getLogger(__name__)

# pymilvus's code for a connection it could not make (client.types.Status.CONNECT_FAILED).
CONNECT_FAILED = 2
TRANSIENT_CODES = {CONNECT_FAILED, ErrorCode.RATE_LIMIT}
TRANSIENT_RPC = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

Method = TypeVar("Method", bound=Callable[..., Any])


def engine_transient(error: BaseException) -> bool:
    if isinstance(error, grpc.RpcError):
        return error.code() in TRANSIENT_RPC
    if isinstance(error, ConnectError | MilvusUnavailableException):
        return True
    return isinstance(error, MilvusException) and error.code in TRANSIENT_CODES


@contextmanager
def _engine_errors() -> Iterator[None]:
    try:
        yield
    except (MilvusException, grpc.RpcError) as exc:
        if engine_transient(exc):
            logger.warning("milvus: the engine is unavailable: %s", exc)
            raise IndexUnavailable() from exc
        raise


def _translated(method: Method) -> Method:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _engine_errors():
            return method(*args, **kwargs)

    return call  # type: ignore[return-value]


class MilvusBackend:
    name: ClassVar[str] = "milvus"
    segmented: ClassVar[bool] = False

    @_translated
    def append(
        self, collection: Collection, *, version: int, ids: Ids, vectors: Vectors, tombstones: Ids
    ) -> None:
        _upsert(collection, ids=ids, vectors=vectors)
        # A re-delivered add passes its ids as tombstones too: the upsert replaced them.
        gone = np.setdiff1d(np.asarray(tombstones, dtype=np.int64), ids)
        if len(gone):
            _after_commit(lambda: engine().delete(gone), what=f"collection {collection.pk}")

    @_translated
    def rebuild(self, collection: Collection, *, version: int, ids: Ids, vectors: Vectors) -> None:
        _upsert(collection, ids=ids, vectors=vectors)
        stale = np.setdiff1d(engine().ids(scope(collection)), ids)
        if len(stale):
            _after_commit(lambda: engine().delete(stale), what=f"collection {collection.pk}")

    @_translated
    def drop(self, *, team_id: int, collection_id: int) -> None:
        engine().drop_scope(Scope(team=team_id, collection=collection_id))

    @_translated
    def dense_search(
        self, collections: Sequence[Collection], query: Vectors, k: int, allowed: Allowed | None
    ) -> list[Hit]:
        return engine().dense_search(query, k, _where(collections, allowed))

    @_translated
    def keyword_search(
        self,
        collections: Sequence[Collection],
        query: KeywordQuery,
        k: int,
        allowed: Allowed | None,
        parameters: BM25Parameters,
    ) -> list[Hit]:
        # k1 and b are the engine index's, set when it was made (MilvusIndex.bm25).
        return engine().keyword_search(query, k, _where(collections, allowed))

    @_translated
    def drift(self, collection: Collection, expected: set[int]) -> Drift:
        # One row holds a chunk's vector and its BM25 terms: both sides hold the same ids.
        held = compare(engine().ids(scope(collection)), expected)
        return Drift(held, held)

    def sweep(self, collection: Collection) -> int:
        return 0

    @_translated
    def leftovers(self, live: Sequence[Collection], *, repair: bool) -> int:
        in_use = self.name == settings.VECTOR_BACKEND or any(
            collection.index_backend == self.name for collection in live
        )
        if not in_use:  # no engine to ask (and none may be running)
            return 0
        found = engine().scopes_except(scope(c) for c in live if c.index_backend == self.name)
        # Read again now: a collection made since ``live`` was read keeps its chunks.
        current = set(
            Collection.objects.filter(
                pk__in=[s.collection for s in found], index_backend=self.name
            ).values_list("pk", flat=True)
        )
        stale = [s for s in found if s.collection not in current]
        if repair:
            for gone in stale:
                engine().drop_scope(gone)
        return len(stale)


@functools.cache
def _engine(uri: str, token: str, name: str, dimension: int, index: str) -> MilvusIndex:
    bm25 = BM25Parameters(k1=settings.KEYWORD_BM25_K1, b=settings.KEYWORD_BM25_B)
    return MilvusIndex(uri, name=name, dimension=dimension, token=token, index=index, bm25=bm25)


def engine() -> MilvusIndex:
    """The process's client of the engine collection for the configured embedding model."""
    return _engine(
        settings.MILVUS_URI,
        settings.MILVUS_TOKEN,
        engine_collection_name(),
        settings.EMBEDDING_DIMENSION,
        settings.MILVUS_INDEX,
    )


def engine_collection_name() -> str:
    """``<prefix>_<model>_<dimension>``: one engine collection per embedding model, named
    from the settings (no model is loaded to learn it)."""
    path = str(settings.EMBEDDER_OPTIONS.get("model_path") or "")
    backend = settings.EMBEDDER_BACKEND.rsplit(".", 1)[-1]
    packaged = backend == "SentenceTransformerEmbedder" and not path
    model = (
        settings.EMBEDDING_MODEL_NAME
        or ("all-MiniLM-L6-v2" if packaged else "")
        or path.rstrip("/").rsplit("/", 1)[-1]
        or backend
    )
    slug = re.sub(r"[^0-9A-Za-z]+", "_", model).strip("_").lower()
    return f"{settings.MILVUS_COLLECTION_PREFIX}_{slug}_{settings.EMBEDDING_DIMENSION}"


def scope(collection: Collection) -> Scope:
    return Scope(team=collection.team_id, collection=collection.pk)


def _upsert(collection: Collection, *, ids: Ids, vectors: Vectors) -> None:
    if not len(ids):
        return
    chunks = chunk_texts(collection_id=collection.pk, ids=ids)
    position = {int(pk): n for n, pk in enumerate(ids)}
    rows = MilvusRows(
        ids=chunks.ids,
        vectors=vectors[[position[int(pk)] for pk in chunks.ids]],
        texts=chunks.texts,
        scope=scope(collection),
        documents=chunks.documents,
    )
    engine().upsert(rows)


def _after_commit(delete: Callable[[], None], *, what: str) -> None:
    """Run ``delete`` once the transaction commits; one the engine misses is logged, not
    raised (the write has committed; its ids' rows are gone, so none is ever returned, and
    ``index_check --repair`` takes them out)."""

    def run() -> None:
        try:
            delete()
        except Exception:
            logger.exception("%s: the engine missed a delete", what)

    transaction.on_commit(run)


def _where(collections: Sequence[Collection], allowed: Allowed | None) -> Where:
    """One team's collections, and the documents its filters allow (None: all)."""
    teams = {collection.team_id for collection in collections}
    if len(teams) > 1:
        raise ValueError("one search reads one team's collections")
    return Where(
        team=next(iter(teams), 0),
        scopes=[scope(collection) for collection in collections],
        documents=None if allowed is None else allowed.documents_of([c.pk for c in collections]),
    )
