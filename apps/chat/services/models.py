"""Model aliases (``small``, ``large``, ``auto``) → what the tier serves, its limits, and
the fair queue in front of it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.accounts.models import Team
from apps.core.aio import loop_cached, redis_client
from apps.core.exceptions import InvalidRequest, NotFound, UpstreamError
from apps.usage import metrics
from inference import (
    InferenceError,
    Lease,
    LocalScheduler,
    OpenAIClient,
    QueueFull,
    RedisScheduler,
    Retry,
    Scheduler,
    Timeouts,
    Tokenizer,
    load_tokenizer,
)


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    served_name: str
    context_window: int
    max_output_tokens: int
    reasoning_opened: bool = False
    """The served model's chat template opens its thinking block in the prompt (R1)."""


def model_aliases() -> list[str]:
    return [*settings.MODEL_ALIASES, "auto"]


def model_alias_resolve(*, alias: str | None) -> tuple[str, dict[str, Any]]:
    """The alias that serves a request naming ``alias`` (``auto`` and none: the default
    one) and its settings. Usage, prices and responses name the alias that served."""
    name = settings.DEFAULT_MODEL_ALIAS if alias in (None, "", "auto") else alias
    config = settings.MODEL_ALIASES.get(name)
    if config is None:
        raise NotFound(
            f"The model {alias!r} does not exist; use one of {model_aliases()}.",
            code="model_not_found",
            param="model",
        )
    return name, config


async def model_resolve(*, alias: str | None) -> ModelSpec:
    """The model an alias names, with its context window (read from the tier, once per
    process, when the settings leave it out)."""
    name, config = model_alias_resolve(alias=alias)
    served_name = str(config["served_name"])
    window = config.get("context_window")
    return ModelSpec(
        alias=name,
        served_name=served_name,
        context_window=int(window) if window else await tier_context_window(served_name),
        max_output_tokens=int(config["max_output_tokens"]),
        reasoning_opened=bool(config.get("reasoning_opened", False)),
    )


_windows: dict[tuple[str, str], int] = {}


async def tier_context_window(served_name: str) -> int:
    """The context window the tier reports for ``served_name`` (vLLM's ``max_model_len``,
    Ollama's ``num_ctx``: see :meth:`inference.OpenAIClient.context_window`)."""
    key = (settings.INFERENCE_BASE_URL, served_name)
    if key not in _windows:
        try:
            window = await inference_client().context_window(served_name)
        except InferenceError as exc:
            raise UpstreamError(f"cannot read the context window from the tier: {exc}") from exc
        if window is None:
            raise UpstreamError(
                f"the tier reports no max_model_len for {served_name!r}; set its context window"
            )
        _windows[key] = window
    return _windows[key]


def output_tokens_resolve(
    *, spec: ModelSpec, max_tokens: int | None, cap: int | None = None
) -> int:
    """``max_tokens`` checked against the model's cap and the caller's limit (``cap``);
    the tighter of the two when none is asked."""
    allowed = spec.max_output_tokens if cap is None else min(cap, spec.max_output_tokens)
    if max_tokens is None:
        return allowed
    if max_tokens > allowed:
        whose = spec.alias if allowed == spec.max_output_tokens else "your token limit"
        raise InvalidRequest(
            f"max_tokens is {max_tokens}; {whose} allows at most {allowed}.",
            code="max_tokens_too_large",
            param="max_tokens",
        )
    return max_tokens


def tokenizer() -> Tokenizer:
    """The tokenizer of the served model (loaded once per process, on first use)."""
    return load_tokenizer(settings.TOKENIZER_BACKEND, **settings.TOKENIZER_OPTIONS)


def inference_client() -> OpenAIClient:
    """The client every answer on this event loop shares: its connections to the tier stay
    open between answers (a new client and connection cost milliseconds before the first
    token). An answer that stops early closes its response, and with it that connection,
    which is what tells the tier to stop generating."""
    return _inference_client(
        settings.INFERENCE_BASE_URL,
        api_key=settings.INFERENCE_API_KEY or None,
        timeouts=Timeouts(**settings.INFERENCE_TIMEOUTS),
        retry=Retry(attempts=settings.INFERENCE_RETRY_ATTEMPTS),
    )


@loop_cached
def _inference_client(
    base_url: str, *, api_key: str | None, timeouts: Timeouts, retry: Retry
) -> OpenAIClient:
    return OpenAIClient(base_url=base_url, api_key=api_key, timeouts=timeouts, retry=retry)


def scheduler() -> Scheduler:
    """The queue in front of the tier: slots leased in Redis when it is configured (shared
    by every web process), else in this process. One per event loop and configuration."""
    return _scheduler(
        settings.INFERENCE_QUEUE_REDIS_URL,
        settings.INFERENCE_BASE_URL,
        capacity=settings.INFERENCE_MAX_CONCURRENCY,
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


async def slot_acquire(*, team: Team) -> Slot:
    """A slot at the tier for one of ``team``'s requests, served fairly across teams;
    ``QueueFull`` (503 with ``Retry-After``) past ``INFERENCE_QUEUE_TIMEOUT``."""
    queue = scheduler()
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
    return Slot(lease)


class Slot:
    """One request's place at the tier: the scheduler's lease, and the slots-in-use gauge
    (up when granted, down once released)."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self.team = lease.team
        self.waited = lease.waited
        self._released = False
        metrics.SLOTS_IN_USE.inc()

    async def release(self) -> None:
        if not self._released:
            self._released = True
            metrics.SLOTS_IN_USE.dec()
        await self._lease.release()
