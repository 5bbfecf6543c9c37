"""Model aliases (``small``, ``large``, ``auto``) → what the tier serves, and its limits."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from apps.core.exceptions import InvalidRequest, NotFound
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
    return ModelSpec(
        alias=str(alias or name),
        served_name=str(config["served_name"]),
        context_window=int(config["context_window"]),
        max_output_tokens=int(config["max_output_tokens"]),
    )


def output_tokens_resolve(*, spec: ModelSpec, max_tokens: int | None) -> int:
    """``max_tokens`` checked against the model's cap; the cap when none is asked."""
    if max_tokens is None:
        return spec.max_output_tokens
    if max_tokens > spec.max_output_tokens:
        raise InvalidRequest(
            f"max_tokens is {max_tokens}; {spec.alias} allows at most {spec.max_output_tokens}.",
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
