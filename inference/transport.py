"""httpx's interface over aiohttp's connection pool and C HTTP parser: the transport the
inference client talks to the tier through.

A tier streams each token as its own HTTP chunk. httpx's own transport (httpcore and h11,
pure Python) decodes and yields those chunks one at a time, and costs several times
aiohttp's CPU per chunk and per request (measured side by side: docs/gateway.md). Through this
transport every read of the body returns all that has arrived since the one before, so an
answer that falls behind catches up a batch at a time; aiohttp's buffer is the read-ahead,
and past it TCP's flow control reaches the tier.

The client keeps httpx's API (and its ``MockTransport`` in tests); only the wire differs.
aiohttp's errors become httpx's, by what happened: a refused or failed connect is a
``ConnectError``, a dropped connection or a cut body a ``RemoteProtocolError``, a timeout
on connect or on a read the matching ``*Timeout``. (The ``httpx-aiohttp`` package, which
the OpenAI SDK uses, maps a refused connect and a dropped stream to ``ConnectTimeout``: a
timeout, where this client must say the tier is unavailable.) Proxy variables from the
environment are not read: the tier is co-deployed and reached directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx

READ_ON_DEMAND = "ragtier.read_on_demand"
"""A request extension: its body is read only when its consumer asks (see ``_Body``)."""

# Most specific first: the first class that matches names what happened.
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.NonHttpUrlClientError, httpx.UnsupportedProtocol),
    (aiohttp.ClientConnectionError, httpx.ReadError),
    (aiohttp.ClientError, httpx.TransportError),
)


@contextlib.contextmanager
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except aiohttp.ClientError as exc:
        kind = next(to for source, to in _ERRORS if isinstance(exc, source))
        raise kind(str(exc) or type(exc).__name__, request=request) from exc


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session, made on first use inside the event loop that uses it; no cap
    on connections (the app's queue bounds what reaches the tier), idle ones kept
    ``keepalive_expiry`` seconds for the next answers.

    A process keeps its clients for the life of its event loop, and nobody closes them by
    hand; the session closes with the loop all the same (see :func:`_closed_with_loop`)."""

    def __init__(self, *, ssl_context: ssl.SSLContext, keepalive_expiry: float = 15.0) -> None:
        self._ssl = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._closer: AsyncGenerator[None] | None = None

    async def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, ssl=self._ssl, keepalive_timeout=self._keepalive_expiry
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,  # httpx decodes what the headers say, as with its own
            )
            self._closer = _closed_with_loop(self._session)
            await anext(self._closer)
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        with _as_httpx_errors(request):
            session = await self._session_now()
            response = await session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    async def aclose(self) -> None:
        if self._closer is not None:
            await self._closer.aclose()  # closes the session
        self._session = self._closer = None


async def _closed_with_loop(session: aiohttp.ClientSession) -> AsyncGenerator[None]:
    """Closes ``session`` when closed itself: by the transport's ``aclose``, or by the event
    loop, which closes every async generator still open before it stops (``asyncio.run``,
    uvicorn, asgiref). Else aiohttp warns of an unclosed session when it is collected."""
    try:
        yield
    finally:
        await session.close()


class _Body(httpx.AsyncByteStream):
    """A response body: each step yields every byte that has arrived (waiting only when
    none has). Closed before its end, the connection is closed, which is how a tier learns
    that nobody reads the answer any more; read to its end, it goes back to the pool.

    A request with the extension ``READ_ON_DEMAND`` is read only when its consumer asks:
    between a chunk and the next request for one, what arrives stays in the socket, so a
    consumer that holds its reads (the client's ``read_interval``) gets the tokens that
    came meanwhile in one read of the socket, not in a wake-up, a parse and a timer reset
    per token (what that saves a streamed answer: docs/gateway.md).
    Such a consumer times its reads itself: aiohttp's read timeout, which would count the
    consumer's own time as the tier's silence, ends at the headers."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request
        self._socket: asyncio.Transport | None = None
        connection = response.connection
        if request.extensions.get(READ_ON_DEMAND) and connection is not None:
            self._socket = connection.transport
            if connection.protocol is not None:
                connection.protocol.read_timeout = None
                connection.protocol.start_timeout()  # with none set: the running one stops

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content, socket = self._response.content, self._socket
        with _as_httpx_errors(self._request):
            while True:
                if socket is not None:
                    socket.resume_reading()
                try:
                    chunk = await content.readany()
                except aiohttp.ClientError:
                    if rest := _held(content):
                        yield rest  # what came before the connection broke goes out first
                    raise
                if not chunk:
                    return
                if socket is not None and not content.at_eof() and not socket.is_closing():
                    socket.pause_reading()  # never at the end: the connection is reused
                yield chunk

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _held(content: aiohttp.StreamReader) -> bytes:
    """The bytes ``content`` still holds. Once a connection breaks, aiohttp's reads raise
    the error before handing over what had already arrived (``readany`` checks it first),
    and no public call returns those bytes: they are a tier's last tokens, sent and
    billed, so they are taken from the buffer itself (aiohttp is pinned; the transport's
    tests cover it)."""
    buffer: Any = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    data = b"".join(buffer)[getattr(content, "_buffer_offset", 0) :]
    buffer.clear()
    content._buffer_offset = 0
    return data
