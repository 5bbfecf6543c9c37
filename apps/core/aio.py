"""Async serving: database work on one bounded pool, and DRF views with async handlers.

A long answer stream spends nearly all its life waiting on the inference tier. Under
Django's ASGI handler, code run with ``sync_to_async`` (thread-sensitive, the default)
goes to a thread of the request's own and keeps its database connection open until the
response ends: one thread and one connection per open stream. Database work here runs
instead on a small shared pool (``DATABASE_THREADS`` workers, so at most that many
connections), and the answer views are async, so an open stream holds neither.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

import redis.asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections
from django.http import HttpRequest, HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

logger = logging.getLogger(__name__)

# How long a command waits for a free connection when the pool is busy.
REDIS_POOL_TIMEOUT = 10.0
REDIS_MAX_CONNECTIONS = 64
P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def _executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        max_workers=settings.DATABASE_THREADS, thread_name_prefix="ragtier-db"
    )


def _healthy(fn: Callable[P, R]) -> Callable[P, R]:
    """Pool threads keep their connections between calls (that is the point); one that
    failed and is no longer usable is dropped before it is used again."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        for connection in connections.all(initialized_only=True):
            if connection.connection is not None and connection.errors_occurred:
                if connection.is_usable():
                    connection.errors_occurred = False
                else:
                    connection.close()
        return fn(*args, **kwargs)

    return call


def loop_cached(fn: Callable[P, R]) -> Callable[P, R]:
    """``functools.cache`` per running event loop: asyncio objects and async clients
    (queues, Redis connections) belong to the loop that made them. Arguments are the key."""
    caches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, R]]
    caches = weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def cached(*args: P.args, **kwargs: P.kwargs) -> R:
        cache = caches.setdefault(asyncio.get_running_loop(), {})
        key = (args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = fn(*args, **kwargs)
        return cache[key]

    return cached


@loop_cached
def redis_client(url: str, *, purpose: str = "shared") -> redis.asyncio.Redis:
    """One async Redis client per URL, ``purpose`` and event loop, shared by every answer:
    not a connection per open stream. Its pool is bounded and, when every connection is
    busy, waits for one (redis-py's default pool would refuse: "Too many connections").
    Connect and every command are bounded (``REDIS_CONNECT_TIMEOUT``,
    ``REDIS_SOCKET_TIMEOUT``); the queue's pub/sub waits pass their own, shorter timeout."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=REDIS_MAX_CONNECTIONS,
        timeout=REDIS_POOL_TIMEOUT,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
    )
    return redis.asyncio.Redis(connection_pool=pool)


def db_call(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``fn`` (sync: ORM, tokenizer, embedder) awaited from async code, on the shared pool."""
    return sync_to_async(_healthy(fn), thread_sensitive=False, executor=_executor())


class AsyncApiView(APIView):
    """A DRF view whose handlers are ``async def``, run on the event loop; errors take the
    one path, DRF's exception handler.

    Authentication, permissions and content negotiation are sync. For a known API key
    they read no database (the process's key cache), so they run on the loop: two thread
    hops fewer before the first token (docs/gateway.md). Whatever does need the database
    (a key not cached yet, a session, ``last_used_at`` once a minute) Django refuses on the
    loop, before any I/O, with ``SynchronousOnlyOperation``; they then run again, whole, on
    the pool (what ran before the refusal is safe to repeat: DRF sets the user only once
    authentication succeeds)."""

    async def dispatch(  # type: ignore[override]
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        self.args, self.kwargs = args, kwargs
        drf_request = self.initialize_request(request, *args, **kwargs)
        self.request = drf_request
        self.headers = self.default_response_headers
        try:
            try:
                self.initial(drf_request, *args, **kwargs)
            except SynchronousOnlyOperation:  # it needs the database: on the pool, then
                await db_call(self.initial)(drf_request, *args, **kwargs)
            await self.acheck_throttles(drf_request)
            method = (drf_request.method or "").lower()
            handler = getattr(self, method, None) if method in self.http_method_names else None
            if handler is None:
                handler = self.http_method_not_allowed
            response = handler(drf_request, *args, **kwargs)
            if inspect.isawaitable(response):  # OPTIONS stays DRF's own, sync
                response = await response
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(drf_request, response, *args, **kwargs)
        return self.response

    def check_throttles(self, request: Request) -> None:
        """Left to :meth:`acheck_throttles`, once ``initial`` has run (wherever it ran)."""

    async def acheck_throttles(self, request: Request) -> None:
        """DRF's throttle check on the loop: a throttle with ``aallow_request`` awaits its
        store (Redis) rather than block the loop; one raising refuses the request."""
        for throttle in self.get_throttles():
            check = getattr(throttle, "aallow_request", None)
            allowed = await check(request, self) if check else throttle.allow_request(request, self)
            if not allowed:
                # None when no wait is known, as DRF's own check passes; its stubs say float.
                self.throttled(request, throttle.wait())  # type: ignore[arg-type]


_background: set[asyncio.Task[None]] = set()


def in_background(work: Awaitable[None], *, what: str) -> asyncio.Task[None]:
    """Run ``work`` on the running loop without waiting for it, kept alive until it ends
    (the loop keeps only a weak reference to a task); a failure is logged as ``what``
    failing, never left unretrieved."""

    async def run() -> None:
        try:
            await work
        except Exception as exc:
            logger.warning("%s failed: %r", what, exc)

    task = asyncio.get_running_loop().create_task(run())
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task
