"""Wake-ups for readers of an answer's stored events: a replay following a running answer
now, a client resuming a detached one next.

The event store announces every write (:mod:`apps.chat.event_store`): with Redis, a
``PUBLISH`` of the message ids on :func:`feed_channel`, in the pipeline that stores the
events; on the database, a call to :meth:`EventFeed.wake` in the writing process. A reader
opens a :class:`Watch` on its message *before* its first read (so no write between that
read and its wait goes unheard), reads, then :meth:`Watch.wait`\\ s; it reads again only
when woken or when the wait times out.

One subscription per process and event loop (:class:`FeedListener`, started with the first
watch, ended once none is left for a while) hears every announcement and wakes the local
watches of the messages named: never a Redis connection per reader. On the database, a
writer in another process wakes nobody here; a reader's own timeout (the caller's
``REPLAY_RECHECK_SECONDS``) is then its slow fallback poll. So are a lost announcement and
an answer whose last events were never stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from redis.connection import parse_url

from apps.core.aio import loop_cached, redis_client

logger = logging.getLogger(__name__)

FEED_CHANNEL_PREFIX = "ragtier:events:new:"
LISTEN_POLL_SECONDS = 1.0
"""How long the listener waits on its subscription before it looks whether anyone still
watches (the wait ends at once when an announcement arrives)."""
LISTEN_IDLE_SECONDS = 30.0
"""How long the subscription stays open with nobody watching (replays come and go)."""
LISTEN_RETRY_SECONDS = 0.5


def feed_channel(url: str) -> str:
    """The channel of the event store at ``url``. Pub/sub is one namespace for a whole
    Redis server, whatever the database: the database's number keeps the announcements of
    deployments (and test runs) that share a server apart, as their message ids are not."""
    db = parse_url(url).get("db", 0)  # type: ignore[no-untyped-call]
    return f"{FEED_CHANNEL_PREFIX}{db}"


def announcement(message_ids: Iterable[int]) -> bytes:
    """What a writer publishes on :func:`feed_channel`: the ids, comma-separated."""
    return ",".join(str(message_id) for message_id in message_ids).encode()


def _announced(data: Any) -> list[int]:
    text = data.decode() if isinstance(data, bytes) else str(data)
    return [int(part) for part in text.split(",") if part.isdigit()]


class Watch:
    """One reader's wake-ups for one message. Use it as a context manager (or
    :meth:`close` it): an open watch is woken by every write of the message's events."""

    def __init__(self, feed: EventFeed, message_id: int) -> None:
        self.feed = feed
        self.message_id = message_id
        self.loop = asyncio.get_running_loop()
        self.woken = asyncio.Event()

    def wake(self) -> None:
        """From any thread: the event belongs to the watch's loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.woken.set()
            return
        with contextlib.suppress(RuntimeError):  # its loop is closed: the reader is gone
            self.loop.call_soon_threadsafe(self.woken.set)

    async def wait(self, seconds: float) -> bool:
        """True when woken (by a write, or by a resubscription that may have missed one),
        False when ``seconds`` passed first."""
        try:
            async with asyncio.timeout(seconds):
                await self.woken.wait()
        except TimeoutError:
            return False
        self.woken.clear()
        return True

    def close(self) -> None:
        self.feed.forget(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class EventFeed:
    """The open watches of this process, by message; thread-safe (writers on the database
    pool, readers on one or more event loops)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[int, set[Watch]] = {}

    def watch(self, message_id: int, *, redis_url: str = "") -> Watch:
        """A new watch on ``message_id``; with ``redis_url``, this loop's listener runs."""
        watch = Watch(self, message_id)
        with self._lock:
            self._watches.setdefault(message_id, set()).add(watch)
        if redis_url:
            feed_listener(redis_url).ensure()
        return watch

    def forget(self, watch: Watch) -> None:
        with self._lock:
            watches = self._watches.get(watch.message_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[watch.message_id]

    def wake(self, message_ids: Iterable[int]) -> int:
        """Wake every watch of these messages; how many were woken."""
        with self._lock:
            found = [w for m in message_ids for w in self._watches.get(m, ())]
        for watch in found:
            watch.wake()
        return len(found)

    def wake_all(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake every watch of ``loop`` (its listener has just (re)subscribed: writes made
        while it was not listening were heard by nobody)."""
        with self._lock:
            found = [w for ws in self._watches.values() for w in ws if w.loop is loop]
        for watch in found:
            watch.wake()

    def watching(self, loop: asyncio.AbstractEventLoop | None = None) -> int:
        """How many watches are open (on ``loop``, when given)."""
        with self._lock:
            return sum(
                1 for ws in self._watches.values() for w in ws if loop is None or w.loop is loop
            )


event_feed = EventFeed()
"""The process's one feed."""


class FeedListener:
    """This event loop's subscription to :func:`feed_channel`, waking the local watches
    of the messages each announcement names."""

    def __init__(self, url: str) -> None:
        self._redis = redis_client(url, purpose="event-feed")
        self._channel = feed_channel(url)
        self._task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            failed = await self._listen_once(loop)
            if not event_feed.watching(loop):
                return
            if failed:  # the watches fall back on their own timeouts meanwhile
                failures += 1
                await asyncio.sleep(min(LISTEN_RETRY_SECONDS * 2 ** min(failures, 6), 30.0))
            else:
                failures = 0

    async def _listen_once(self, loop: asyncio.AbstractEventLoop) -> bool:
        """One subscription, until nobody watched for a while (False) or it failed (True)."""
        idle_since = loop.time()
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self._channel)
            while True:
                message = await pubsub.get_message(timeout=LISTEN_POLL_SECONDS)
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # redis-py may swallow it
                    raise asyncio.CancelledError
                if message is not None:
                    self._hear(message, loop)
                if event_feed.watching(loop):
                    idle_since = loop.time()
                elif loop.time() - idle_since >= LISTEN_IDLE_SECONDS:
                    return False
        except Exception as exc:
            logger.warning("event feed: subscription failed: %r", exc)
            return True
        finally:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception as exc:
                logger.debug("event feed: closing the subscription failed: %r", exc)

    @staticmethod
    def _hear(message: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        kind = message.get("type")
        if kind == "subscribe":
            event_feed.wake_all(loop)
        elif kind == "message":
            event_feed.wake(_announced(message.get("data")))


@loop_cached
def feed_listener(url: str) -> FeedListener:
    return FeedListener(url)
