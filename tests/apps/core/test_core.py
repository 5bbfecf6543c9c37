import json
import os
import subprocess
import sys

import httpx
import pytest
from django.test import Client

from apps.core.asgi import BodySizeLimit
from config.env import BASE_DIR


async def echo_app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Stands in for Django: reads the whole body, like Django's ASGI handler does."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = json.dumps({"read": size}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def guarded(settings: object) -> httpx.AsyncClient:
    settings.MAX_JSON_BODY_BYTES = 100  # type: ignore[attr-defined]
    settings.MAX_UPLOAD_BYTES = 1000  # type: ignore[attr-defined]
    transport = httpx.ASGITransport(app=BodySizeLimit(echo_app))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_asgi_guard_refuses_declared_oversize_before_reading(
    guarded: httpx.AsyncClient,
) -> None:
    response = await guarded.post(
        "/api/v1/search", content=b"x" * 101, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    ok = await guarded.post(
        "/api/v1/search", content=b"x" * 100, headers={"content-type": "application/json"}
    )
    assert ok.json() == {"read": 100}


async def test_asgi_guard_stops_a_chunked_body_past_the_limit(guarded: httpx.AsyncClient) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(200):
            yield b"y" * 1000  # no Content-Length: streamed

    response = await guarded.post(
        "/api/v1/collections/1/documents",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=x", "authorization": "Bearer k"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "file_too_large"


@pytest.mark.parametrize(
    "path",
    ["/api/v1/search", "/api/v1/collections", "/v1/chat/completions", "/admin/login/", "/nowhere"],
)
async def test_asgi_guard_refuses_multipart_off_the_upload_route_from_its_headers(
    guarded: httpx.AsyncClient, path: str
) -> None:
    """Issue 27, item 10: a multipart body of up to the upload limit was spooled to disk on
    any path, before routing or auth. Now only the upload route takes one; elsewhere it is
    415 before a byte is read, chunked or declared."""

    async def chunks():  # type: ignore[no-untyped-def]
        yield b"z" * 500

    declared = {"content-type": "multipart/form-data; boundary=x", "content-length": "900"}
    for body, headers in (
        (b"z" * 900, declared),
        (chunks(), {"content-type": "Multipart/Form-Data; boundary=x"}),
    ):
        response = await guarded.post(path, content=body, headers=headers)
        assert response.status_code == 415, path
        assert response.json() == {
            "error": {
                "type": "invalid_request_error",
                "code": "unsupported_media_type",
                "message": "A multipart body is accepted only by the document upload endpoint.",
                "param": None,
            }
        }
    upload = await guarded.post(
        "/api/v1/collections/7/documents",
        content=b"z" * 900,
        headers={**declared, "authorization": "Bearer some-key"},
    )
    assert upload.json() == {"read": 900}  # the upload route still reads it


async def test_asgi_guard_refuses_an_upload_without_credentials_before_reading_it(
    guarded: httpx.AsyncClient,
) -> None:
    """Spooling an upload to disk costs the shared process before authentication runs:
    a multipart body naming neither a key nor a session is 401 from its headers."""
    headers = {"content-type": "multipart/form-data; boundary=x", "content-length": "900"}
    anonymous = await guarded.post(
        "/api/v1/collections/7/documents", content=b"z" * 900, headers=headers
    )
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "missing_api_key"
    session = await guarded.post(
        "/api/v1/collections/7/documents",
        content=b"z" * 900,
        headers={**headers, "cookie": "csrftoken=a; sessionid=b"},
    )
    assert session.json() == {"read": 900}


def test_unknown_paths_answer_json_errors(client: Client, db: None) -> None:
    response = client.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_openapi_schema_documents_every_endpoint(client: Client, db: None) -> None:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/api/v1/collections",
        "/api/v1/collections/{collection_id}",
        "/api/v1/collections/{collection_id}/documents",
        "/api/v1/documents/{document_id}",
        "/api/v1/search",
    ):
        assert path in paths, path
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    page = docs.content.lower()  # assets come from the sidecar package, not a CDN
    assert b"//cdn" not in page and b"unpkg" not in page  # (a bare "cdn" may be in a token)


def test_production_settings_name_every_missing_variable() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "RAGTIER_ENCRYPTION"))
    }
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.production"
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    names = (
        "DJANGO_SECRET_KEY, DATABASE_URL, REDIS_URL, DJANGO_ALLOWED_HOSTS, RAGTIER_ENCRYPTION_KEYS"
    )
    assert names in result.stderr, result.stderr[-2000:]
