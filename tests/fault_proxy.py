"""An asyncio TCP proxy between the app and the inference tier that breaks the wire.

Modes (``FaultProxy.mode``, read per connection):

- ``pass``: bytes both ways, untouched (keep-alive works through it);
- ``silent``: accepts, reads the request, never answers;
- ``stall``: relays the response until the first body chunk after the headers, then
  holds the connection open and sends nothing more;
- ``unavailable``: answers ``503`` (``Connection: close``) ``times`` times, then passes;
- ``reset``: relays the first body chunk, then resets the connection (RST, not FIN);
- ``huge``: answers 200 ``text/event-stream`` and sends one 10 MB ``data:`` line;
- ``garbage``: answers bytes that are not HTTP at all.

:meth:`FaultProxy.cut` resets every connection relayed at that moment (a network drop);
later ones pass. It also stands between a browser and the app.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

Mode = Literal["pass", "silent", "stall", "unavailable", "reset", "huge", "garbage"]
HUGE_BYTES = 10 * 1024 * 1024


@dataclass
class FaultProxy:
    target: str  # the tier's base URL
    mode: Mode = "pass"
    times: int = 3
    connections: int = 0
    refused: int = 0
    base_url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _held: list[asyncio.StreamWriter] = field(default_factory=list)
    _open: set[asyncio.StreamWriter] = field(default_factory=set)
    _thread: threading.Thread | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        mode = self.mode
        if mode == "unavailable" and self.refused >= self.times:
            mode = "pass"
        try:
            if mode == "pass":
                await self._relay(reader, writer)
            elif mode in ("stall", "reset"):
                await self._relay(reader, writer, cut=mode)
            else:
                await _read_request(reader)
                await self._answer(mode, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if mode not in ("silent", "stall"):
                writer.close()

    async def _answer(self, mode: Mode, writer: asyncio.StreamWriter) -> None:
        if mode == "silent":
            self._held.append(writer)
            return
        if mode == "unavailable":
            self.refused += 1
            body = b'{"error": {"message": "loading model", "code": 503}}'
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
        elif mode == "huge":
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            )
            writer.write(b"data: " + b"x" * HUGE_BYTES)
        elif mode == "garbage":
            writer.write(os.urandom(4096))
        await writer.drain()

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cut: Literal["stall", "reset"] | None = None,
    ) -> None:
        parts = urlsplit(self.target)
        up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port)
        self._open.add(writer)

        async def upstream_bound() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def client_bound() -> None:
            seen = b""
            while data := await up_reader.read(65536):
                if cut is not None:
                    seen += data
                    head, _, body = seen.partition(b"\r\n\r\n")
                    first = body.find(b"\n\n")
                    if first >= 0:  # the headers and the first event, nothing after
                        writer.write(head + b"\r\n\r\n" + body[: first + 2])
                        await writer.drain()
                        if cut == "reset":
                            _reset(writer)
                        else:
                            self._held.append(writer)
                        up_writer.close()
                        return
                    continue
                writer.write(data)
                await writer.drain()

        sending = asyncio.ensure_future(upstream_bound())
        try:
            await client_bound()
        finally:
            sending.cancel()
            self._open.discard(writer)
            up_writer.close()

    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
            port = server.sockets[0].getsockname()[1]
            self.base_url = f"http://127.0.0.1:{port}{urlsplit(self.target).path}"
            ready.set()
            loop.run_forever()
            server.close()
            for writer in self._held:
                writer.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def cut(self) -> None:
        """Reset every connection relayed now, both ways, as a network drop does."""

        def reset_all() -> None:
            for writer in list(self._open):
                _reset(writer)
            self._open.clear()

        assert self._loop is not None
        self._loop.call_soon_threadsafe(reset_all)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    await reader.readexactly(length)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
