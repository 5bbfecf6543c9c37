"""Collections, documents and search through the HTTP API (fake embedder, real FAISS)."""

from collections.abc import Callable

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.knowledge.backends import backend_of
from apps.knowledge.models import Chunk, Collection, Document
from apps.usage.models import UsageRecord
from apps.usage.selectors import usage_tokens_total
from tests.apps.accounts.test_auth import error_of
from tests.retrieval.test_parsing import make_pdf

# Real commits: ingestion is queued on commit and runs eagerly (Celery eager mode).
pytestmark = pytest.mark.django_db(transaction=True)


def create_collection(api: APIClient, name: str = "handbook") -> int:
    response = api.post("/api/v1/collections", {"name": name}, format="json")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def add_text(api: APIClient, collection_id: int, title: str, text: str) -> dict[str, object]:
    response = api.post(
        f"/api/v1/collections/{collection_id}/documents",
        {"title": title, "text": text},
        format="json",
    )
    assert response.status_code == 202, response.content
    return response.json()  # type: ignore[no-any-return]


def test_collection_crud(owner_api: APIClient) -> None:
    api = owner_api  # deleting a collection needs an owner or admin
    collection_id = create_collection(api)
    listed = api.get("/api/v1/collections").json()
    assert [c["name"] for c in listed["results"]] == ["handbook"]
    assert api.get(f"/api/v1/collections/{collection_id}").json()["document_count"] == 0
    duplicate = api.post("/api/v1/collections", {"name": "handbook"}, format="json")
    assert (duplicate.status_code, error_of(duplicate)["code"]) == (400, "already_exists")
    assert api.delete(f"/api/v1/collections/{collection_id}").status_code == 204
    assert api.get(f"/api/v1/collections/{collection_id}").status_code == 404


@pytest.mark.usefixtures("index_backend")
def test_upload_ingest_search_delete(owner_api: APIClient, team: Team) -> None:
    api = owner_api  # deleting a document needs an owner or admin
    collection_id = create_collection(api)
    queued = add_text(api, collection_id, "Pets", "Cats sleep sixteen hours a day.")
    assert queued["status"] == "queued" and queued["progress"] == 0
    document = api.get(f"/api/v1/documents/{queued['id']}").json()
    assert (document["status"], document["progress"], document["chunk_count"]) == (
        "indexed",
        100,
        1,
    )
    add_text(api, collection_id, "Space", "Jupiter is the largest planet of the solar system.")

    results = api.post("/api/v1/search", {"query": "largest planet"}, format="json").json()[
        "results"
    ]
    assert results[0]["title"] == "Space"
    assert results[0]["score"] >= results[-1]["score"]
    assert set(results[0]) == {
        "chunk_id",
        "document_id",
        "collection_id",
        "title",
        "headings",
        "chunk_index",
        "score",
        "snippet",
    }

    assert api.delete(f"/api/v1/documents/{queued['id']}").status_code == 204
    assert not Chunk.objects.filter(document_id=queued["id"]).exists()
    collection = Collection.objects.get(pk=collection_id)
    chunks = set(Chunk.objects.filter(collection=collection).values_list("pk", flat=True))
    assert len(chunks) == 1 and backend_of(collection).drift(collection, chunks).clean
    results = api.post("/api/v1/search", {"query": "cats sleep"}, format="json").json()["results"]
    assert all(r["document_id"] != queued["id"] for r in results)


def test_multipart_upload_of_each_type(api: APIClient) -> None:
    collection_id = create_collection(api)
    files = {
        "notes.txt": b"Plain text about apples.",
        "guide.md": b"# Guide\n\n## Setup\n\nInstall the bananas.",
        "page.html": b"<html><title>Page</title><body><h2>Cherries</h2><p>Red.</p></body></html>",
        "paper.pdf": make_pdf(["Dates grow on palms"]),
    }
    for name, data in files.items():
        response = api.post(
            f"/api/v1/collections/{collection_id}/documents",
            {"file": SimpleUploadedFile(name, data)},
            format="multipart",
        )
        assert response.status_code == 202, (name, response.content)
    documents = {d.filename: d for d in Document.objects.all()}
    assert all(d.status == "indexed" for d in documents.values()), [
        (d.filename, d.error) for d in documents.values()
    ]
    assert documents["guide.md"].title == "Guide"
    assert Chunk.objects.get(document=documents["guide.md"]).headings == ["Setup"]
    assert documents["paper.pdf"].page_count == 1
    hit = api.post("/api/v1/search", {"query": "palms dates"}, format="json").json()["results"][0]
    assert hit["document_id"] == documents["paper.pdf"].pk


def test_same_content_twice_returns_the_existing_document(api: APIClient) -> None:
    collection_id = create_collection(api)
    first = add_text(api, collection_id, "Pets", "Dogs bark.")
    again = api.post(
        f"/api/v1/collections/{collection_id}/documents",
        {"title": "Pets again", "text": "Dogs bark."},
        format="json",
    )
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert Document.objects.count() == 1


@pytest.mark.parametrize(
    ("payload", "status", "code", "param"),
    [
        ({}, 400, "missing_field", "file"),
        ({"text": "body"}, 400, "missing_field", "title"),
        ({"title": "t", "text": "   "}, 400, "empty_document", "text"),
        ({"title": "t", "text": "x", "format": "docx"}, 400, "invalid_value", "format"),
    ],
)
def test_document_validation_errors(
    api: APIClient, payload: dict[str, str], status: int, code: str, param: str
) -> None:
    collection_id = create_collection(api)
    response = api.post(f"/api/v1/collections/{collection_id}/documents", payload, format="json")
    assert response.status_code == status
    assert (error_of(response)["code"], error_of(response)["param"]) == (code, param)
    assert not Document.objects.exists()


def test_unsupported_and_oversized_files_are_refused_before_any_work(
    api: APIClient, settings: object
) -> None:
    collection_id = create_collection(api)
    url = f"/api/v1/collections/{collection_id}/documents"
    response = api.post(url, {"file": SimpleUploadedFile("x.exe", b"MZ...")}, format="multipart")
    assert (response.status_code, error_of(response)["code"]) == (415, "unsupported_file_type")
    response = api.post(url, {"file": SimpleUploadedFile("x.txt", b"\xff\xfe")}, format="multipart")
    assert (response.status_code, error_of(response)["code"]) == (415, "invalid_encoding")

    settings.MAX_UPLOAD_BYTES = 1000  # type: ignore[attr-defined]
    big = SimpleUploadedFile("big.txt", b"a" * 5000)
    response = api.post(url, {"file": big}, format="multipart")
    assert (response.status_code, error_of(response)["code"]) == (413, "file_too_large")

    assert not Document.objects.exists()


def test_a_pdf_past_the_page_limit_fails_in_the_worker_not_the_upload(
    api: APIClient, settings: object
) -> None:
    """The web process never opens a PDF: its pages are counted by the parse stage."""
    settings.MAX_PDF_PAGES = 2  # type: ignore[attr-defined]
    collection_id = create_collection(api)
    pdf = SimpleUploadedFile("long.pdf", make_pdf(["a", "b", "c"]))
    response = api.post(
        f"/api/v1/collections/{collection_id}/documents", {"file": pdf}, format="multipart"
    )
    assert response.status_code == 202
    document = api.get(f"/api/v1/documents/{response.json()['id']}").json()
    assert (document["status"], document["chunk_count"]) == ("failed", 0)
    assert document["error"] == "too_many_pages: the PDF has 3 pages; the limit is 2"
    assert not UsageRecord.objects.exists()  # nothing was embedded


def test_json_body_limit(api: APIClient, settings: object) -> None:
    settings.MAX_JSON_BODY_BYTES = 100  # type: ignore[attr-defined]
    response = api.post("/api/v1/search", {"query": "x" * 500}, format="json")
    assert (response.status_code, error_of(response)["code"]) == (413, "payload_too_large")


def test_invalid_json_and_limits_on_search(api: APIClient) -> None:
    response = api.post("/api/v1/search", "{not json", content_type="application/json")
    assert (response.status_code, error_of(response)["code"]) == (400, "invalid_json")
    response = api.post("/api/v1/search", {"query": "x", "top_k": 10_000}, format="json")
    assert (response.status_code, error_of(response)["param"]) == (400, "top_k")
    response = api.post("/api/v1/search", {"query": "x", "collections": [999]}, format="json")
    assert (response.status_code, error_of(response)["code"]) == (404, "not_found")
    response = api.get("/api/v1/collections?limit=1000")
    assert (response.status_code, error_of(response)["code"]) == (400, "page_size_too_large")


def test_chunk_limit_fails_the_document_before_embedding(api: APIClient, settings: object) -> None:
    settings.MAX_CHUNKS_PER_DOCUMENT = 2  # type: ignore[attr-defined]
    collection_id = create_collection(api)
    text = "\n\n".join(f"## Part {i}\n\nParagraph {i}." for i in range(5))
    response = api.post(
        f"/api/v1/collections/{collection_id}/documents",
        {"title": "Long", "text": text, "format": "markdown"},
        format="json",
    )
    document = api.get(f"/api/v1/documents/{response.json()['id']}").json()
    assert document["status"] == "failed"
    assert "more than 2 chunks" in document["error"]
    assert not UsageRecord.objects.exists()


def test_collection_count_limit(api: APIClient, settings: object) -> None:
    settings.MAX_COLLECTIONS_PER_TEAM = 1  # type: ignore[attr-defined]
    create_collection(api, "one")
    response = api.post("/api/v1/collections", {"name": "two"}, format="json")
    assert (response.status_code, error_of(response)["code"]) == (400, "collection_limit_reached")


def test_embedding_tokens_are_charged_to_the_team(api: APIClient, team: Team) -> None:
    collection_id = create_collection(api)
    document = add_text(api, collection_id, "Pets", "Cats sleep sixteen hours a day.")
    stored = Document.objects.get(pk=document["id"])
    ingest = UsageRecord.objects.get(operation="ingest")
    assert ingest.kind == "embedding" and ingest.team == team
    assert ingest.prompt_tokens == stored.embedding_tokens > 0
    api.post("/api/v1/search", {"query": "cats"}, format="json")
    query = UsageRecord.objects.get(operation="query")
    assert query.prompt_tokens == 1 + 2  # one word, plus the model's two special tokens
    assert query.api_key is not None
    assert usage_tokens_total(team=team, kind="embedding") == ingest.prompt_tokens + 3


@pytest.mark.usefixtures("index_backend")
def test_other_teams_objects_are_404_and_never_searched(
    api: APIClient, other_team: Team, api_as: Callable[..., APIClient]
) -> None:
    collection_id = create_collection(api)
    secret = add_text(api, collection_id, "Secret", "The launch code is swordfish.")
    intruder = api_as(other_team)
    own = create_collection(intruder, "mine")
    add_text(intruder, own, "Mine", "Swordfish recipes and launch parties.")

    for path in (
        f"/api/v1/collections/{collection_id}",
        f"/api/v1/documents/{secret['id']}",
        f"/api/v1/collections/{collection_id}/documents",
    ):
        response = intruder.get(path)
        assert (response.status_code, error_of(response)["code"]) == (404, "not_found"), path
    assert intruder.delete(f"/api/v1/documents/{secret['id']}").status_code == 404
    assert intruder.delete(f"/api/v1/collections/{collection_id}").status_code == 404
    response = intruder.post(
        f"/api/v1/collections/{collection_id}/documents", {"title": "x", "text": "y"}, format="json"
    )
    assert response.status_code == 404
    response = intruder.post(
        "/api/v1/search",
        {"query": "launch code swordfish", "collections": [collection_id]},
        format="json",
    )
    assert response.status_code == 404
    results = intruder.post(
        "/api/v1/search", {"query": "launch code swordfish", "top_k": 50}, format="json"
    ).json()["results"]
    assert results and {r["collection_id"] for r in results} == {own}
    assert [c["id"] for c in intruder.get("/api/v1/collections").json()["results"]] == [own]
    assert Document.objects.filter(pk=secret["id"]).exists()
