"""The SSE response is asynchronous end to end (a sync iterator would be read whole)."""

from __future__ import annotations

import pytest
from django.test import AsyncClient

from apps.accounts.services import IssuedKey
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


async def test_sse_response_is_async(upstream: FakeUpstream, issued_key: IssuedKey) -> None:
    client = AsyncClient()
    auth = {"Authorization": f"Bearer {issued_key.secret}"}
    created = await client.post(
        "/api/v1/conversations", {}, content_type="application/json", headers=auth
    )
    assert created.status_code == 201, created.json()
    conversation = created.json()["id"]
    response = await client.post(
        f"/api/v1/conversations/{conversation}/messages",
        {"content": "Hi", "top_k": 0},
        content_type="application/json",
        headers={**auth, "Accept": "text/event-stream"},
    )
    assert response.status_code == 200
    assert response.streaming and response.is_async
    body = b"".join([chunk async for chunk in response.streaming_content])
    assert body.rstrip().endswith(b'"finish_reason":"stop"}')
    assert b"event: done" in body
