"""The inference tier as the answers meet it: the context window each model reports, the
upstreams an answer goes to in the order to try them, a client per upstream, and the fair
queue and circuit breaker in front of each upstream.

Which alias names which registry entry is :mod:`.registry`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.crypto import salted_hmac
from redis.exceptions import RedisError

from apps.accounts.models import Team
from apps.chat.services.registry import (
    AUTO,
    ModelChoice,
    ModelSpec,
    auto_entries,
    model_alias_resolve,
    model_registry,
)
from apps.core.aio import loop_cached, redis_client
from apps.core.exceptions import UpstreamError
from apps.usage import metrics
from inference import (
    BreakerPolicy,
    ChatRequest,
    CircuitBreaker,
    InferenceError,
    Lease,
    LocalBreakerStore,
    LocalScheduler,
    ModelEntry,
    OpenAIClient,
    QueueFull,
    RedisBreakerStore,
    RedisScheduler,
    Retry,
    Scheduler,
    Target,
    Timeouts,
    rendezvous_order,
)


async def model_resolve(*, alias: str | None) -> ModelSpec:
    """The model an alias names, with its context window (read from the tier, once per
    process, when the registry leaves it out)."""
    return await _spec(model_alias_resolve(alias=alias))


async def model_choose(*, alias: str | None) -> ModelChoice:
    """What may serve a request naming ``alias``: that alias, or for ``auto`` the small
    and the large model (answer preparation picks by the prompt's size)."""
    registry = model_registry()
    entries = auto_entries(registry) if alias == AUTO else [model_alias_resolve(alias=alias)]
    specs = tuple([await _spec(entry) for entry in entries])
    return ModelChoice(requested=alias or registry.default, candidates=specs)


async def _spec(entry: ModelEntry) -> ModelSpec:
    window = entry.context_window or await tier_context_window(entry)
    return ModelSpec(entry=entry, context_window=window)


_windows: dict[tuple[str, str], int] = {}


async def tier_context_window(entry: ModelEntry) -> int:
    """The context window the tier reports for ``entry`` (vLLM's ``max_model_len``,
    Ollama's ``num_ctx``: see :meth:`inference.OpenAIClient.context_window`), from the
    first of its upstreams that answers."""
    for upstream in entry.upstreams:
        key = (upstream, entry.model)
        if key in _windows:
            return _windows[key]
    failure: InferenceError | None = None
    for upstream in entry.upstreams:
        client = inference_client(upstream, api_key=entry.api_key)
        try:
            window = await client.context_window(entry.model)
        except InferenceError as exc:
            failure = exc
            continue
        if window is not None:
            _windows[(upstream, entry.model)] = window
            return window
        raise UpstreamError(
            f"the tier reports no max_model_len for {entry.model!r}; set its context window"
        )
    raise UpstreamError(
        f"cannot read the context window of {entry.alias!r} from the tier: {failure}"
    )


def route_targets(
    *, spec: ModelSpec, request: ChatRequest, affinity: str, cache_salt: str
) -> list[Target]:
    """Where to send an answer, in the order to try: the alias's upstreams by rendezvous
    hashing on ``affinity`` (a conversation keeps its upstream, and the upstream's prefix
    cache), then its fallback alias's, and so on. Each request to a server that takes one
    carries the team's ``cache_salt`` (:func:`cache_salt_derive`)."""
    targets: list[Target] = []
    for entry in model_registry().chain(spec.alias):
        entry_request = request.for_model(
            model=entry.model,
            max_tokens=min(request.max_tokens, entry.max_output_tokens),
            reasoning_opened=entry.reasoning_opened,
            cache_salt=cache_salt if entry.takes_cache_salt else None,
            server=entry.server,
        )
        targets.extend(
            Target(alias=entry.alias, upstream=url, request=entry_request, api_key=entry.api_key)
            for url in rendezvous_order(affinity, entry.upstreams)
        )
    return targets


def affinity_key(*, team_id: int, conversation_id: int, opening: str) -> str:
    """What pins an answer to an upstream: its team's conversation, or without one (the
    OpenAI surface keeps none by default) the team and the head of its prompt, which stays
    the same from turn to turn. The team is in every key: two teams sending the same
    system prompt share no placement by it."""
    if conversation_id:
        return f"team:{team_id}:conversation:{conversation_id}"
    head = hashlib.blake2b(opening.encode(), digest_size=16).hexdigest()
    return f"team:{team_id}:prompt:{head}"


CACHE_SALT_PURPOSE = "ragtier.inference.cache_salt"


def cache_salt_derive(*, team_id: int) -> str:
    """The team's prefix-cache salt (vLLM's ``cache_salt``): an HMAC of its id under the
    server's secret, so the tier sees no team id and no team can work out another's.
    Requests share cached prefix blocks only with the same salt, so a team's
    ``cached_tokens`` count only its own earlier prompts."""
    return salted_hmac(CACHE_SALT_PURPOSE, str(team_id), algorithm="sha256").hexdigest()


def inference_client(upstream: str, *, api_key: str | None = None) -> OpenAIClient:
    """The client every answer on this event loop shares for ``upstream``: its connections
    stay open between answers (a new client and connection cost milliseconds before the
    first token). An answer that stops early closes its response, and with it that
    connection, which is what tells the tier to stop generating."""
    return _inference_client(
        upstream,
        api_key=api_key,
        timeouts=Timeouts(**settings.INFERENCE_TIMEOUTS),
        retry=Retry(attempts=settings.INFERENCE_RETRY_ATTEMPTS),
        read_interval=settings.INFERENCE_STREAM_INTERVAL,
    )


@loop_cached
def _inference_client(
    base_url: str, *, api_key: str | None, timeouts: Timeouts, retry: Retry, read_interval: float
) -> OpenAIClient:
    return OpenAIClient(
        base_url=base_url,
        api_key=api_key,
        timeouts=timeouts,
        retry=retry,
        read_interval=read_interval,
    )


def upstream_capacity(upstream: str) -> int:
    limit = model_registry().upstreams().get(upstream)
    return limit or settings.INFERENCE_MAX_CONCURRENCY


def scheduler(upstream: str) -> Scheduler:
    """The queue in front of ``upstream``: slots leased in Redis when it is configured
    (shared by every web process), else in this process. One per event loop, upstream
    and configuration."""
    return _scheduler(
        settings.INFERENCE_QUEUE_REDIS_URL,
        upstream,
        capacity=upstream_capacity(upstream),
        lease_seconds=settings.INFERENCE_QUEUE_LEASE_SECONDS,
        key_prefix=settings.INFERENCE_QUEUE_KEY_PREFIX,
    )


@loop_cached
def _scheduler(
    redis_url: str, name: str, *, capacity: int, lease_seconds: float, key_prefix: str
) -> Scheduler:
    if not redis_url:
        return LocalScheduler(capacity=capacity)
    return RedisScheduler(
        redis=redis_client(redis_url, purpose="queue"),  # its own pool (see RedisScheduler)
        name=name,
        capacity=capacity,
        lease_seconds=lease_seconds,
        key_prefix=key_prefix,
    )


def breaker() -> CircuitBreaker:
    """The upstreams' circuit breakers: in Redis when configured (every process sees an
    upstream open within ``INFERENCE_BREAKER_FRESH_SECONDS``), else in this process."""
    policy = BreakerPolicy(
        failures=settings.INFERENCE_BREAKER_FAILURES, cool_off=settings.INFERENCE_BREAKER_COOL_OFF
    )
    url = settings.INFERENCE_BREAKER_REDIS_URL
    if not url:
        return CircuitBreaker(store=_local_breakers(), policy=policy)
    return _redis_breaker(
        url,
        policy=policy,
        key_prefix=settings.INFERENCE_QUEUE_KEY_PREFIX,
        fresh_for=settings.INFERENCE_BREAKER_FRESH_SECONDS,
    )


@functools.cache
def _local_breakers() -> LocalBreakerStore:
    return LocalBreakerStore()


@receiver(setting_changed)
def _settings_changed(**_: Any) -> None:
    _local_breakers.cache_clear()


@loop_cached
def _redis_breaker(
    url: str, *, policy: BreakerPolicy, key_prefix: str, fresh_for: float
) -> CircuitBreaker:
    store = RedisBreakerStore(
        redis=redis_client(url), key_prefix=key_prefix, ttl=max(3600.0, 10 * policy.cool_off)
    )
    return CircuitBreaker(store=store, policy=policy, fresh_for=fresh_for)


async def slot_acquire(*, team: Team, upstream: str) -> Slot:
    """A slot at ``upstream`` for one of ``team``'s requests, served fairly across teams;
    ``QueueFull`` (503 with ``Retry-After``) past ``INFERENCE_QUEUE_TIMEOUT``."""
    queue = scheduler(upstream)
    started = time.monotonic()
    metrics.QUEUE_DEPTH.inc()
    try:
        lease = await queue.acquire(
            team=str(team.pk),
            weight=max(1, team.queue_weight),
            timeout=settings.INFERENCE_QUEUE_TIMEOUT,
        )
    except QueueFull:
        metrics.QUEUE_FULL.inc()
        raise
    finally:
        metrics.QUEUE_DEPTH.dec()
        metrics.QUEUE_WAIT.observe(time.monotonic() - started)
    return Slot(lease, upstream=upstream)


class Slot:
    """One request's place at an upstream: the scheduler's lease, and the slots-in-use
    gauge (up when granted, down once released)."""

    def __init__(self, lease: Lease, *, upstream: str) -> None:
        self._lease = lease
        self.upstream = upstream
        self.team = lease.team
        self.waited = lease.waited
        self._released = False
        metrics.SLOTS_IN_USE.inc()

    async def release(self) -> None:
        if not self._released:
            self._released = True
            metrics.SLOTS_IN_USE.dec()
        await self._lease.release()


@dataclass(frozen=True)
class UpstreamStatus:
    url: str
    circuit: str
    slots_in_use: int | None
    """None: the queue's store (Redis) cannot be read now."""
    capacity: int


@dataclass(frozen=True)
class ModelStatus:
    alias: str
    model: str
    context_window: int | None
    max_output_tokens: int
    tokenizer: str
    fallback: str | None
    upstreams: list[UpstreamStatus]


async def model_registry_status() -> list[ModelStatus]:
    """The registry as the admin sees it: each alias, and each of its upstreams' circuit
    and slots in use (across processes when both live in Redis; else this process's)."""
    circuits = breaker()
    statuses = []
    for entry in model_registry():
        upstreams = []
        for url in entry.upstreams:
            try:
                in_use: int | None = await scheduler(url).in_use()
            except (InferenceError, RedisError):
                in_use = None
            upstreams.append(
                UpstreamStatus(
                    url=url,
                    circuit=str(await circuits.state(url)),
                    slots_in_use=in_use,
                    capacity=upstream_capacity(url),
                )
            )
        statuses.append(
            ModelStatus(
                alias=entry.alias,
                model=entry.model,
                context_window=entry.context_window,
                max_output_tokens=entry.max_output_tokens,
                tokenizer=entry.tokenizer.backend.rpartition(".")[2],
                fallback=entry.fallback,
                upstreams=upstreams,
            )
        )
    return statuses
