"""A collection of random unit vectors with stand-in chunk rows, built straight into the
database (retrieval_latency and index_write measure on it), and stand-in chunk text
(keyword_index and index_kinds)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

DIMENSION = 384
VOCABULARY = 50_000
CHUNK_TEXT = (
    "Benchmark chunk {i}. Retrieval augmented generation answers a question from passages "
    "found by vector search; this row stands in for a real chunk of about two hundred word "
    "pieces so that fetching it from the database costs what fetching a real one costs. "
) * 3


@dataclass
class Fixture:
    size: int
    team: Any
    collection: Any
    insert_seconds: float
    rebuild_seconds: float


def create_fixture(size: int, *, batch_size: int, seed: int, backend: str | None = None) -> Fixture:
    """A team, a collection of ``size`` chunk rows with random vectors, and its index built
    by ``collection_index_rebuild`` in ``backend`` (None: the collection's default)."""
    from django.db import transaction

    from apps.accounts.services import team_create
    from apps.knowledge.models import Chunk, Document
    from apps.knowledge.services import collection_create, collection_index_rebuild

    tag = uuid.uuid4().hex[:8]
    team = team_create(name=f"bench-{size}-{tag}")
    collection = collection_create(team=team, name=f"bench-{size}")
    document = Document.objects.create(
        team=team,
        collection=collection,
        title=f"Benchmark document ({size} chunks)",
        filename="bench.txt",
        media_type="text/plain",
        source="bench/bench.txt",
        size_bytes=0,
        content_hash=uuid.uuid4().hex,
        status=Document.Status.INDEXED,
        stage=Document.Stage.DONE,
        progress=100,
        chunk_count=size,
    )

    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    for start in range(0, size, batch_size):
        stop = min(start + batch_size, size)
        vectors = random_unit_vectors(rng, stop - start)
        rows = [
            Chunk(
                document=document,
                collection=collection,
                index=i,
                text=CHUNK_TEXT.format(i=i),
                headings=[],
                token_count=200,
                embedding=vectors[i - start].tobytes(),
            )
            for i in range(start, stop)
        ]
        with transaction.atomic():
            Chunk.objects.bulk_create(rows, batch_size=batch_size)
    insert_seconds = time.perf_counter() - started

    started = time.perf_counter()
    collection = collection_index_rebuild(collection_id=collection.pk, backend=backend)
    rebuild_seconds = time.perf_counter() - started
    return Fixture(size, team, collection, insert_seconds, rebuild_seconds)


def random_unit_vectors(rng: np.random.Generator, count: int) -> npt.NDArray[np.float32]:
    vectors = rng.standard_normal((count, DIMENSION), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def synthetic_texts(count: int, *, words: int, seed: int) -> list[str]:
    """``count`` texts of ``words`` words each, drawn from a Zipf distribution over a
    50,000-word vocabulary, so that posting lengths look like a natural language's."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocabulary = [
        "".join(rng.choice(letters, size=int(rng.integers(3, 11)))) for _ in range(VOCABULARY)
    ]
    ranks = np.minimum(rng.zipf(1.1, size=(count, words)), VOCABULARY) - 1
    return [" ".join(vocabulary[r] for r in row) for row in ranks]
