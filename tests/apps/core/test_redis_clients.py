"""Every Redis client has a connect and a socket timeout: a hung Redis costs seconds."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from apps.core.aio import redis_client
from apps.usage.limiters import redis as limiters


async def test_the_shared_async_client_has_both_timeouts(settings: Any) -> None:
    settings.REDIS_CONNECT_TIMEOUT, settings.REDIS_SOCKET_TIMEOUT = 1.5, 4.0
    for purpose in ("shared", "queue"):
        client = redis_client("redis://127.0.0.1:1/0", purpose=purpose)
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_connect_timeout"] == 1.5
        assert kwargs["socket_timeout"] == 4.0


def test_the_rate_limiter_client_has_both_timeouts(settings: Any) -> None:
    settings.RATE_LIMIT_REDIS_TIMEOUT = 0.25
    limiters._redis_client.cache_clear()
    try:
        kwargs = limiters._redis_client("redis://127.0.0.1:1/0").connection_pool.connection_kwargs
    finally:
        limiters._redis_client.cache_clear()
    assert kwargs["socket_connect_timeout"] == 0.25
    assert kwargs["socket_timeout"] == 0.25


@pytest.fixture
def celery_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``config.settings.celery`` as read with a Redis broker, then as it was."""
    import config.settings.celery as module

    monkeypatch.setenv("CELERY_BROKER_URL", "redis://redis:6379/0")
    monkeypatch.setenv("REDIS_CONNECT_TIMEOUT", "1.5")
    monkeypatch.setenv("REDIS_SOCKET_TIMEOUT", "4")
    import config.settings.redis

    importlib.reload(config.settings.redis)
    yield importlib.reload(module)
    monkeypatch.undo()
    importlib.reload(config.settings.redis)
    importlib.reload(module)


def test_the_celery_broker_has_both_timeouts(celery_settings: Any) -> None:
    options = celery_settings.CELERY_BROKER_TRANSPORT_OPTIONS
    assert options["socket_connect_timeout"] == 1.5
    assert options["socket_timeout"] == 4.0


async def test_a_redis_that_never_answers_is_an_error_not_a_hang(settings: Any) -> None:
    """A server that accepts the connection and then says nothing."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings.REDIS_SOCKET_TIMEOUT = 0.2
    client = redis_client(f"redis://127.0.0.1:{port}/0", purpose="silent")
    try:
        # Far past the 0.2 s set, far short of a hang (or of a timeout not read from settings).
        async with asyncio.timeout(5):
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.ping()
    finally:
        await client.aclose()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
