"""The contract every index backend keeps, and what they share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from apps.core.exceptions import DEPENDENCY_RETRY_SECONDS, Overloaded, retry_after_header
from apps.knowledge.models import Chunk, Collection
from retrieval import BM25Parameters, Hit, Ids, KeywordQuery, Vectors, embedding_text

# Up to this many chunk ids are fetched by key; more, by one pass over the collection
# (under every database's limit on query parameters).
APPEND_LOOKUP_LIMIT = 5_000


@dataclass(frozen=True)
class Allowed:
    """What a search's metadata filters let through, per collection: the chunk ids (FAISS
    filters its segments by them) and the documents they belong to (the engine filters by
    those: a few ids where chunk ids could be millions)."""

    chunks: dict[int, Ids]
    documents: dict[int, Ids]

    def __bool__(self) -> bool:
        return True  # an empty filter still filters (everything out)

    def chunks_of(self, collection_id: int) -> Ids:
        return self.chunks.get(collection_id, NO_IDS)

    def documents_of(self, collection_ids: Sequence[int]) -> Ids:
        parts = [self.documents.get(pk, NO_IDS) for pk in collection_ids]
        return np.concatenate(parts) if parts else NO_IDS


NO_IDS: Ids = np.zeros(0, dtype=np.int64)


class IndexUnavailable(Overloaded):
    """The index cannot be reached (the engine is down, restarting or throttling): nothing
    is searched or charged, and a stage that met it is retried."""

    code = "index_unavailable"

    def __init__(self) -> None:
        super().__init__(
            "The search index cannot be reached; retry shortly.",
            headers=retry_after_header(DEPENDENCY_RETRY_SECONDS),
        )


@dataclass(frozen=True)
class Drift:
    """How a collection's index differs from the database: what each side holds wrong
    (None: right), and leftovers the index keeps outside the live set."""

    vectors: str | None
    keywords: str | None
    leftovers: int = 0

    @property
    def clean(self) -> bool:
        return self.vectors is None and self.keywords is None and not self.leftovers


class IndexBackend(Protocol):
    name: ClassVar[str]
    # True: writes append segments a compaction merges (the row's base trails its
    # version); False: the engine keeps its own (the base is always the version).
    segmented: ClassVar[bool]

    def append(
        self, collection: Collection, *, version: int, ids: Ids, vectors: Vectors, tombstones: Ids
    ) -> None:
        """Add ``ids`` with their ``vectors`` (keywords from their database text) after
        deleting ``tombstones``, as version ``version``. Called holding the collection row,
        inside the transaction of the row changes the write reflects."""
        ...

    def rebuild(self, collection: Collection, *, version: int, ids: Ids, vectors: Vectors) -> None:
        """Replace the collection's whole index with ``ids`` as version ``version``
        (holding the row, inside its transaction)."""
        ...

    def drop(self, *, team_id: int, collection_id: int) -> None:
        """Delete everything the collection's index holds (after its delete commits)."""
        ...

    def dense_search(
        self, collections: Sequence[Collection], query: Vectors, k: int, allowed: Allowed | None
    ) -> list[Hit]:
        """The ``k`` nearest chunks of ``collections`` (one team's) to ``query``, among
        those ``allowed`` (None: all)."""
        ...

    def keyword_search(
        self,
        collections: Sequence[Collection],
        query: KeywordQuery,
        k: int,
        allowed: Allowed | None,
        parameters: BM25Parameters,
    ) -> list[Hit]:
        """The ``k`` best chunks of ``collections`` (one team's) by BM25, among those
        ``allowed`` (None: all)."""
        ...

    def drift(self, collection: Collection, expected: set[int]) -> Drift:
        """How the index differs from ``expected``, the chunk ids the database has live."""
        ...

    def sweep(self, collection: Collection) -> int:
        """Remove the leftovers :meth:`drift` counted; returns how many."""
        ...

    def leftovers(self, live: Sequence[Collection], *, repair: bool) -> int:
        """How many indexes the backend keeps for collections that are not ``live`` on it
        (deleted, or moved to another backend, while it could not drop them); removed when
        ``repair``. A collection that exists on it now is never touched."""
        ...


@dataclass(frozen=True)
class ChunkTexts:
    """Chunks as the keyword side indexes them, in id order."""

    ids: Ids
    texts: list[str]
    documents: list[int]


def chunk_texts(*, collection_id: int, ids: Ids) -> ChunkTexts:
    """The collection's chunks among ``ids``, each as it is embedded (``embedding_text``:
    the document's title and the chunk's headings, then its text), so a title's words find
    its chunks too."""
    wanted = {int(pk) for pk in ids}
    rows = Chunk.objects.filter(collection_id=collection_id)
    if len(wanted) <= APPEND_LOOKUP_LIMIT:  # a delta's few chunks: looked up by key
        rows = rows.filter(pk__in=wanted)
    found: list[int] = []
    texts: list[str] = []
    documents: list[int] = []
    for pk, document, title, headings, text in (
        rows.order_by("pk")
        .values_list("pk", "document_id", "document__title", "headings", "text")
        .iterator(chunk_size=2000)
    ):
        if pk in wanted:
            found.append(pk)
            documents.append(document)
            texts.append(embedding_text(title, tuple(headings), text))
    return ChunkTexts(np.asarray(found, dtype=np.int64), texts, documents)


def compare(held_ids: Ids, expected: set[int]) -> str | None:
    """None when the index holds exactly the expected chunk ids, else what is wrong."""
    held = {int(pk) for pk in held_ids}
    if len(held_ids) == len(expected) and held == expected:
        return None
    missing, extra = len(expected - held), len(held - expected)
    return f"{len(held_ids)} (missing {missing}, extra {extra})"
