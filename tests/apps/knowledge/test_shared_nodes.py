"""Stateless web nodes (issue 32): two uvicorn processes and one Celery worker, each a
real process over the same database, give the same answers after every write.

The team uploads through node A's API and the worker ingests; then each write goes
through a different door (an upload on node B, a delete on node B's API, a re-ingest in
node A's admin, a compaction on the worker), and every search, in every mode, on either
node, must answer exactly what the other does and what one exact index built afresh from
the database's rows answers. Both nodes search before each write, so each answers from
segments it has cached: the test proves that a node's cache follows the row, not that a
cold node reads the files. The real MiniLM embeds in every process.

Once per index backend (:func:`node_environments`): FAISS, the three sharing one data
dir and its segment files; Milvus, each with a data dir of its own and one engine
(``milvus-lite server``), where the engine's BM25 is its own, so only dense answers are
held to the database's ranking there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from django.conf import settings

from apps.accounts.services import IssuedKey
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services.indexing import embedder
from apps.knowledge.services.search import bm25_parameters, fusion_policy
from config.celery import app as celery_app
from config.env import BASE_DIR
from retrieval import (
    KeywordIndex,
    Segment,
    SegmentedIndex,
    VectorIndex,
    embedding_text,
    fuse,
    fusion_depth,
    keyword_query,
)
from tests.apps.knowledge.conftest import Worker, wait_for
from tests.conftest import REAL_EMBEDDER, free_port, milvus_lite_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CORPUS = BASE_DIR / "demo" / "corpus"
FIRST = [
    "api-keys-and-authentication.md",
    "document-chunking.md",
    "document-ingestion-pipeline.md",
    "inference-tier.md",
    "streaming-answers-over-sse.md",
    "vector-search-with-faiss.md",
]
ADDED = "token-accounting-and-quotas.md"
DELETED = "streaming-answers-over-sse.md"
REINGESTED = "vector-search-with-faiss.md"
# What each of those three is found by, before its write or after it.
FINDS = {
    ADDED: "reserve, call and settle a token quota",
    DELETED: "server-sent events that stream the answer token by token",
    REINGESTED: "FAISS inner product search over normalised vectors",
}
QUERIES = [
    "How is an API key checked on each request?",
    "overlap between consecutive chunks",
    "Which stages does the Celery worker run for an upload?",
    *FINDS.values(),
]
MODES = ["dense", "keyword", "hybrid"]
TOP_K = 5
ADMIN_PASSWORD = "a-long-password-3"
NODES = ["node-a", "node-b", "worker"]


def node_environments(
    backend: str, *, data_dir: Path, broker: str, engine: str = ""
) -> list[dict[str, str]]:
    """The environments of node A, node B and the worker, on ``backend``.

    faiss: all three share one data dir, whose index segment files every write appends
    and every node reads. milvus: each its own data dir (no index file is shared; the
    uploads, which the worker reads, stay in one place) and the engine at ``engine``.
    """
    common = {
        "VECTOR_BACKEND": backend,
        "EMBEDDER_BACKEND": REAL_EMBEDDER,
        "HF_HUB_OFFLINE": "1",
        # Uploads and re-ingests go to the worker over the broker, not run in the node.
        "CELERY_BROKER_URL": broker,
        "CELERY_TASK_ALWAYS_EAGER": "false",
        # A few hundred searches in a row; the request limit is tested elsewhere.
        "REQUEST_RATE_PER_SECOND": "0",
        "RATE_LIMIT_KEY_PREFIX": settings.RATE_LIMIT_KEY_PREFIX,
    }
    if backend == "faiss":
        shared = {**common, "RAGTIER_TEST_DATA_DIR": str(data_dir)}
        # Compaction runs only when the test sends it, and is due then whatever the count
        # of dead vectors.
        return [shared, shared, {**shared, "INDEX_COMPACT_TOMBSTONE_RATIO": "0.000001"}]
    if backend == "milvus":
        return [
            {
                **common,
                "RAGTIER_TEST_DATA_DIR": str(data_dir / name),
                "RAGTIER_TEST_MEDIA_ROOT": str(data_dir / "media"),
                "MILVUS_URI": engine,
                # Exact, as the database's ranking is.
                "MILVUS_INDEX": "FLAT",
            }
            for name in NODES
        ]
    raise ValueError(f"no node environment for the {backend!r} backend")


@dataclass
class Cluster:
    backend: str
    a: httpx.Client
    b: httpx.Client
    worker: Worker

    @property
    def nodes(self) -> dict[str, httpx.Client]:
        return {"A": self.a, "B": self.b}


@pytest.fixture(params=["faiss", "milvus"])
def cluster(
    request: pytest.FixtureRequest,
    asgi_workers: Callable[..., list[str]],
    start_worker: Callable[..., Worker],
    broker: str,
    issued_key: IssuedKey,
    real_embedder: None,
    settings: Any,
    tmp_path: Path,
) -> Iterator[Cluster]:
    backend = str(request.param)
    settings.VECTOR_BACKEND = backend
    engine = request.getfixturevalue("milvus_server") if backend == "milvus" else ""
    env_a, env_b, env_worker = node_environments(
        backend, data_dir=tmp_path, broker=broker, engine=engine
    )
    worker = start_worker(**env_worker)
    (url_a,) = asgi_workers(count=1, **env_a)
    (url_b,) = asgi_workers(count=1, **env_b)
    headers = {"Authorization": f"Bearer {issued_key.secret}"}
    with (
        httpx.Client(base_url=url_a, headers=headers, timeout=60) as a,
        httpx.Client(base_url=url_b, headers=headers, timeout=60) as b,
    ):
        yield Cluster(backend, a, b, worker)


def test_two_nodes_and_a_worker_agree_after_every_write(
    cluster: Cluster, staff: Any, tmp_path: Path
) -> None:
    created = cluster.a.post("/api/v1/collections", json={"name": "handbook"})
    assert created.status_code == 201, created.text
    collection_id = created.json()["id"]
    assert Collection.objects.get(pk=collection_id).index_backend == cluster.backend
    ids = {name: upload(cluster.a, collection_id, name) for name in FIRST}
    ingested(cluster, collection_id)
    answers = agreed(cluster, collection_id)
    assert_found(answers, FINDS[DELETED], ids[DELETED])
    assert_found(answers, FINDS[REINGESTED], ids[REINGESTED])

    # A new document, through the other node.
    ids[ADDED] = upload(cluster.b, collection_id, ADDED)
    ingested(cluster, collection_id)
    answers = agreed(cluster, collection_id)
    assert_found(answers, FINDS[ADDED], ids[ADDED])

    # A delete on node B's API: node B writes the tombstones (and caches them as it
    # commits), node A finds them on disk.
    deleted_chunks = chunk_ids_of(ids[DELETED])
    assert cluster.b.delete(f"/api/v1/documents/{ids[DELETED]}").status_code == 204
    answers = agreed(cluster, collection_id)
    assert_gone(answers, ids[DELETED], deleted_chunks)

    # A re-ingest in node A's admin: node A tombstones the old chunks, the worker indexes
    # new ones.
    old_chunks = chunk_ids_of(ids[REINGESTED])
    with admin_session(cluster.a.base_url) as admin:
        reingest = admin.post(
            "/admin/knowledge/document/",
            data={
                "action": "reingest",
                "_selected_action": str(ids[REINGESTED]),
                "csrfmiddlewaretoken": admin.cookies["csrftoken"],
            },
        )
    assert reingest.status_code == 302, reingest.text
    ingested(cluster, collection_id)
    answers = agreed(cluster, collection_id)
    assert_gone(answers, ids[DELETED], deleted_chunks | old_chunks)
    assert_found(answers, FINDS[REINGESTED], ids[REINGESTED])

    if cluster.backend == "faiss":
        # The worker merges base and deltas into a new base and prunes the files both
        # nodes had read; each must load the new base.
        before = Collection.objects.get(pk=collection_id)
        celery_app.send_task(
            "apps.knowledge.tasks.collection_index_compact_task", args=[collection_id]
        )
        wait_for(
            lambda: Collection.objects.filter(
                pk=collection_id, index_base=before.index_version
            ).exists(),
            worker=cluster.worker,
            what="the compaction",
        )
        assert Collection.objects.get(pk=collection_id).index_version == before.index_version
        answers = agreed(cluster, collection_id)
        assert_gone(answers, ids[DELETED], deleted_chunks | old_chunks)
    else:
        # No node wrote an index file of its own.
        assert not [p for name in NODES for p in (tmp_path / name / "indexes").rglob("*")]


Answers = dict[tuple[str, str], list[tuple[int, int, float]]]


def upload(node: httpx.Client, collection_id: int, name: str) -> int:
    response = node.post(
        f"/api/v1/collections/{collection_id}/documents",
        files={"file": (name, (CORPUS / name).read_bytes(), "text/markdown")},
    )
    assert (response.status_code, response.json()["status"]) == (202, "queued"), response.text
    return int(response.json()["id"])


def chunk_ids_of(document_id: int) -> set[int]:
    return set(Chunk.objects.filter(document_id=document_id).values_list("pk", flat=True))


def ingested(cluster: Cluster, collection_id: int) -> None:
    """Wait until every document of the collection is indexed; none may fail."""
    documents = Document.objects.filter(collection_id=collection_id)

    def done() -> bool:
        if documents.filter(status=Document.Status.FAILED).exists():
            return True
        return not documents.exclude(status=Document.Status.INDEXED).exists()

    wait_for(done, worker=cluster.worker, timeout=300, what="ingestion")
    failed = list(documents.filter(status=Document.Status.FAILED).values_list("title", "error"))
    assert not failed, f"{failed}\n{cluster.worker.output()}"


def search(node: httpx.Client, query: str, mode: str) -> list[tuple[int, int, float]]:
    response = node.post("/api/v1/search", json={"query": query, "mode": mode, "top_k": TOP_K})
    assert response.status_code == 200, response.text
    return [(r["chunk_id"], r["document_id"], r["score"]) for r in response.json()["results"]]


def agreed(cluster: Cluster, collection_id: int) -> Answers:
    """Every query in every mode on both nodes: the same ranked chunks with the same
    scores on each, and those one exact index built from the database ranks first."""
    answers: Answers = {}
    live = set(
        Chunk.objects.filter(
            collection_id=collection_id, document__status=Document.Status.INDEXED
        ).values_list("pk", flat=True)
    )
    for query in QUERIES:
        for mode in MODES:
            on = {name: search(node, query, mode) for name, node in cluster.nodes.items()}
            assert on["A"] == on["B"], f"{mode} {query!r}: node A {on['A']}, node B {on['B']}"
            answers[query, mode] = on["A"]
            assert {hit[0] for hit in on["A"]} <= live, f"{mode} {query!r}: {on['A']}"
            if mode != "dense" and cluster.backend != "faiss":
                continue  # the engine's own BM25 statistics, not bm25s's over the collection
            expected = database_ranking(collection_id, query, mode)
            assert [hit[0] for hit in on["A"]] == [chunk for chunk, _ in expected], (
                f"{mode} {query!r}: the nodes {on['A']}, the database {expected}"
            )
            assert [hit[2] for hit in on["A"]] == pytest.approx(
                [score for _, score in expected], rel=1e-4, abs=1e-5
            ), f"{mode} {query!r}"
    return answers


def database_ranking(collection_id: int, query: str, mode: str) -> list[tuple[int, float]]:
    """What a search must rank first, from the database alone: one exact index over the
    indexed documents' chunks (their stored vectors; their text as ingestion indexes it),
    searched as the product searches."""
    rows = list(
        Chunk.objects.filter(collection_id=collection_id, document__status=Document.Status.INDEXED)
        .order_by("pk")
        .values_list("pk", "embedding", "document__title", "headings", "text", "document_id")
    )
    ids = np.array([row[0] for row in rows], dtype=np.int64)
    vectors = np.vstack([np.frombuffer(row[1] or b"", dtype=np.float32) for row in rows])
    texts = [
        embedding_text(title, tuple(headings), text) for _, _, title, headings, text, _ in rows
    ]
    documents = {row[0]: row[5] for row in rows}
    index = SegmentedIndex(
        [
            Segment(
                VectorIndex.build(settings.EMBEDDING_DIMENSION, "flat", ids=ids, vectors=vectors),
                KeywordIndex.build(ids.tolist(), texts),
            )
        ]
    )
    policy = fusion_policy()
    depth = fusion_depth(TOP_K, policy.depth) if mode == "hybrid" else TOP_K
    dense = index.search(embedder().embed([query]).vectors, depth)[0]
    keyword = index.keyword_search(
        keyword_query(query, max_terms=settings.KEYWORD_MAX_QUERY_TERMS),
        depth,
        parameters=bm25_parameters(),
    )
    hits = {
        "dense": dense,
        "keyword": keyword,
        "hybrid": fuse(dense, keyword, policy=policy, limit=TOP_K, documents=documents),
    }[mode]
    return [(hit.id, hit.score) for hit in hits[:TOP_K]]


def assert_found(answers: Answers, query: str, document_id: int) -> None:
    for mode in MODES:
        found = {document for _, document, _ in answers[query, mode]}
        assert document_id in found, f"{mode} {query!r}: {answers[query, mode]}"


def assert_gone(answers: Answers, document_id: int, chunk_ids: set[int]) -> None:
    assert chunk_ids
    for (query, mode), hits in answers.items():
        assert not [hit for hit in hits if hit[1] == document_id or hit[0] in chunk_ids], (
            f"{mode} {query!r}: {hits}"
        )


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("root", password=ADMIN_PASSWORD)


@contextmanager
def admin_session(base_url: httpx.URL) -> Iterator[httpx.Client]:
    """A client signed in to the admin at ``base_url`` as ``staff`` (its CSRF cookie kept)."""
    with httpx.Client(base_url=base_url, timeout=60) as client:
        page = client.get("/admin/login/")
        assert page.status_code == 200, page.text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None
        signed_in = client.post(
            "/admin/login/?next=/admin/",
            data={"username": "root", "password": ADMIN_PASSWORD, "csrfmiddlewaretoken": token[1]},
        )
        assert signed_in.status_code == 302, signed_in.text
        yield client


@pytest.fixture
def milvus_server(tmp_path: Path) -> Iterator[str]:
    """``milvus-lite server`` in a process of its own, its data under ``tmp_path``: the
    engine every node of the milvus case reaches."""
    uri = f"http://127.0.0.1:{free_port()}"
    with milvus_lite_server(uri, tmp_path / "milvus"):
        yield uri
