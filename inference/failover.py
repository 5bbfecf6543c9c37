"""Fallback before the first token: the next upstream of the alias, then the fallback
alias's, never after the first token.

A failed attempt is a connect error, a 5xx, a first-token timeout, or an open circuit
(that upstream is skipped without being tried). Each counts against the upstream's
circuit breaker; a first event closes it again. A 429 also moves on (another upstream may
have room) but is no fault of the upstream's. The last target in line keeps the client's
own retries; the others get one attempt, since another upstream is the better retry.
Errors in the request itself (context length, a 400) end it at once: every upstream would
refuse it alike.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from inference.breaker import CircuitBreaker
from inference.chat import ChatRequest, Event
from inference.client import OpenAIClient, Retry
from inference.errors import (
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    UpstreamRateLimited,
)
from inference.stream import Interrupt

logger = logging.getLogger(__name__)

FAULTS = (InferenceUnavailable, InferenceTimeout)
"""Failures that count against an upstream's circuit."""
ONE_ATTEMPT = Retry(attempts=1)


@dataclass(frozen=True, slots=True)
class Target:
    """One place to send an answer: an alias, one of its upstreams, and the request in
    that alias's terms (its served name, its output cap)."""

    alias: str
    upstream: str
    request: ChatRequest
    api_key: str | None = field(default=None, repr=False)


class AllUpstreamsDown(InferenceUnavailable):
    """Every upstream that could serve the request has its circuit open."""


class Failover:
    """The events of the first target that answers (see the module). ``served`` is the
    target that produced the first event; ``current`` the one being tried; ``tried`` every
    target a request went to, in order (a target skipped with its circuit open is not)."""

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        breaker: CircuitBreaker,
        client: Callable[[Target], OpenAIClient],
    ) -> None:
        if not targets:
            raise ValueError("a failover needs at least one target")
        self.targets = list(targets)
        self.breaker = breaker
        self._client = client
        self._index = 0
        self.current: Target = self.targets[0]
        self.served: Target | None = None
        self.tried: list[Target] = []

    @property
    def target(self) -> Target:
        """The target that served, or the one tried last."""
        return self.served or self.current

    async def first(self) -> Target:
        """The first target whose circuit lets a request through (taking the probe of a
        half-open one); :class:`AllUpstreamsDown` when none does."""
        found = await self._next_allowed(0)
        if found is None:
            raise AllUpstreamsDown(
                "Every inference upstream for this model is failing.",
                alias=self.targets[0].alias,
            )
        self._index = found
        self.current = self.targets[found]
        return self.current

    async def _next_allowed(self, start: int) -> int | None:
        """The index of the first target from ``start`` whose circuit lets it through."""
        for index in range(start, len(self.targets)):
            upstream = self.targets[index].upstream
            if await self.breaker.allow(upstream):
                return index
            logger.info("upstream %s skipped: its circuit is open", upstream)
        return None

    async def stream(
        self,
        *,
        switch: Callable[[Target], Awaitable[None]],
        interrupt: Interrupt | None = None,
    ) -> AsyncIterator[Event]:
        """Events from :attr:`current` (taken by :meth:`first`), moving on to the next
        allowed target after a failure before the first event; ``switch`` is awaited
        before each move (to hold a slot at the new upstream). ``interrupt`` stops a wait
        for the tier from outside (:class:`~inference.stream.Interrupt`)."""
        index = self._index
        while True:
            target = self.current = self.targets[index]
            self.tried.append(target)
            last = index == len(self.targets) - 1
            started = False
            try:
                retry = None if last else ONE_ATTEMPT
                # Closed as soon as this generator is (the client left): closing the
                # connection is what stops the tier generating.
                async with aclosing(
                    self._client(target).stream_chat(
                        target.request, retry=retry, interrupt=interrupt
                    )
                ) as stream:
                    async for event in stream:
                        if not started:
                            started = True
                            self.served = target
                            await self.breaker.success(target.upstream)
                        yield event
                if not started:
                    self.served = target
                    await self.breaker.success(target.upstream)
                return
            except InferenceError as exc:
                exc.alias = target.alias  # what the caller is told failed (never where)
                if started or not isinstance(exc, (*FAULTS, UpstreamRateLimited)):
                    raise
                if isinstance(exc, FAULTS):
                    await self.breaker.failure(target.upstream)
                following = await self._next_allowed(index + 1)
                if following is None:
                    raise
                index = following
                logger.warning(
                    "upstream %s (%s) failed before the first token (%s); trying %s (%s)",
                    target.upstream,
                    target.alias,
                    exc.code,
                    self.targets[index].upstream,
                    self.targets[index].alias,
                )
                await switch(self.targets[index])
