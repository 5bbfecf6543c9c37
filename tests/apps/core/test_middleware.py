"""The middleware stack under ASGI: Django's stock hooks run on the event loop (no thread
hop before an async view's first byte), with the same headers, cookies and sessions."""

from __future__ import annotations

import io
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.contrib.auth import get_user_model
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient
from django.urls import path

STOCK = [
    "django.middleware.security.SecurityMiddleware",
    "apps.core.middleware.ContentSecurityPolicyMiddleware",  # ours, async: no hop
    "apps.core.middleware.BodySizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


async def ping(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


urlpatterns = [path("ping", ping)]


def request_for(path: str) -> ASGIRequest:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"cookie", b"sessionid=abc; csrftoken=x" * 1)],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
    }
    return ASGIRequest(scope, io.BytesIO())


async def served(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any]]:
    """The response to GET /ping through the whole async stack, and every thread hop."""
    hops: list[Any] = []
    original = SyncToAsync.__call__

    async def counting(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(self.func)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting)
    handler = ASGIHandler()
    response = await handler.get_response_async(request_for("/ping"))
    return response, hops


@pytest.mark.urls(__name__)
async def test_the_stack_makes_no_thread_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    response, hops = await served(monkeypatch)
    assert response.status_code == 200
    assert hops == []


@pytest.mark.urls(__name__)
async def test_djangos_stock_stack_would_hop(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.MIDDLEWARE = STOCK
    _, hops = await served(monkeypatch)
    assert len(hops) >= 10  # what the stack above saves, every request


@pytest.mark.urls(__name__)
async def test_same_headers_as_djangos_stack(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    ours, _ = await served(monkeypatch)
    settings.MIDDLEWARE = STOCK
    stock, _ = await served(monkeypatch)
    assert sorted(ours.headers.items()) == sorted(stock.headers.items())
    assert ours.headers["X-Frame-Options"] == "DENY"
    assert ours.headers["X-Content-Type-Options"] == "nosniff"
    assert ours.headers["Referrer-Policy"] == "same-origin"
    assert "script-src 'self';" in ours.headers["Content-Security-Policy"]


@pytest.mark.urls(__name__)
async def test_a_view_may_set_its_own_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.core.middleware import ContentSecurityPolicyMiddleware

    async def strict(request: HttpRequest) -> JsonResponse:
        response = JsonResponse({})
        response.headers["Content-Security-Policy"] = "default-src 'none'"
        return response

    response = await ContentSecurityPolicyMiddleware(strict)(request_for("/ping"))
    assert response.headers["Content-Security-Policy"] == "default-src 'none'"


@pytest.mark.django_db(transaction=True)
async def test_a_sign_in_served_async_saves_its_session() -> None:
    """The one write (a modified session) still happens, in a thread, as Django does it."""
    user_model = get_user_model()
    await user_model.objects.acreate_user(username="ada", password="correct horse battery")
    client = AsyncClient()
    page = await client.get("/login")
    assert page.status_code == 200
    response = await client.post("/login", {"username": "ada", "password": "correct horse battery"})
    assert response.status_code == 302
    assert "sessionid" in response.cookies
    session = await client.asession()
    assert await session.aget("_auth_user_id") is not None
