"""Model aliases (``small``, ``large``, ``auto``) → what the tier serves, and its limits."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import httpx
from django.conf import settings

from apps.core.exceptions import InvalidRequest, NotFound, UpstreamError
from inference import OpenAIClient, Retry, Timeouts, Tokenizer, load_tokenizer


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    served_name: str
    context_window: int
    max_output_tokens: int


def model_aliases() -> list[str]:
    return [*settings.MODEL_ALIASES, "auto"]


def model_resolve(*, alias: str | None) -> ModelSpec:
    """The model an alias names; ``auto`` (and no alias) is the default one."""
    name = settings.DEFAULT_MODEL_ALIAS if alias in (None, "", "auto") else alias
    config = settings.MODEL_ALIASES.get(name)
    if config is None:
        raise NotFound(
            f"The model {alias!r} does not exist; use one of {model_aliases()}.",
            code="model_not_found",
            param="model",
        )
    served_name = str(config["served_name"])
    window = config.get("context_window")
    return ModelSpec(
        alias=str(alias or name),
        served_name=served_name,
        context_window=int(window) if window else tier_context_window(served_name=served_name),
        max_output_tokens=int(config["max_output_tokens"]),
    )


def tier_context_window(*, served_name: str) -> int:
    """The context window the tier reports for ``served_name`` (vLLM's ``max_model_len``)."""
    return _tier_context_window(settings.INFERENCE_BASE_URL, served_name)


@functools.cache
def _tier_context_window(base_url: str, served_name: str) -> int:
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/models", timeout=5.0)
        response.raise_for_status()
        models = response.json().get("data", [])
    except (httpx.HTTPError, ValueError) as exc:
        raise UpstreamError(f"cannot read the context window from the tier: {exc!r}") from exc
    for model in models:
        if model.get("id") == served_name and model.get("max_model_len"):
            return int(model["max_model_len"])
    raise UpstreamError(
        f"the tier reports no max_model_len for {served_name!r}; set its context window"
    )


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
    """A client for one answer; its connections close with it."""
    return OpenAIClient(
        base_url=settings.INFERENCE_BASE_URL,
        api_key=settings.INFERENCE_API_KEY or None,
        timeouts=Timeouts(**settings.INFERENCE_TIMEOUTS),
        retry=Retry(attempts=settings.INFERENCE_RETRY_ATTEMPTS),
    )
