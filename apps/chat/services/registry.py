"""Model aliases (``small``, ``large``, ``auto``) → the registry entry that serves them,
its tokenizer and its output cap.

The registry is read from settings once (``INFERENCE_MODELS``, else today's
``INFERENCE_BASE_URL`` and ``MODEL_*`` settings as one entry per alias) and read again
only when a setting changes (tests). What the tier itself is asked (context windows) and
where each answer goes is :mod:`.tier`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from apps.core.exceptions import InvalidRequest, NotFound
from apps.usage.services import cost_of
from inference import (
    ModelEntry,
    Registry,
    RegistryError,
    Tokenizer,
    TokenizerSpec,
    registry_parse,
)

AUTO = "auto"
AUTO_ALIASES = ("small", "large")
"""What ``auto`` routes between: the first for prompts up to
``ROUTER_SMALL_MAX_PROMPT_TOKENS`` tokens, the second beyond."""


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry with its context window known (read from the tier if need be)."""

    entry: ModelEntry
    context_window: int

    @property
    def alias(self) -> str:
        return self.entry.alias

    @property
    def served_name(self) -> str:
        return self.entry.model

    @property
    def max_output_tokens(self) -> int:
        return self.entry.max_output_tokens

    @property
    def reasoning_opened(self) -> bool:
        return self.entry.reasoning_opened

    @property
    def tokenizer(self) -> Tokenizer:
        return self.entry.tokenizer.load()


@dataclass(frozen=True)
class ModelChoice:
    """What a request asked for (``requested``, as named: ``auto`` stays ``auto``) and the
    aliases that may serve it, in order of preference: one, or two for ``auto``."""

    requested: str
    candidates: tuple[ModelSpec, ...]

    @property
    def routed(self) -> bool:
        return len(self.candidates) > 1


@functools.cache
def model_registry() -> Registry:
    """The registry (read once; again after a setting changes)."""
    try:
        if settings.INFERENCE_MODELS:
            return registry_parse(
                settings.INFERENCE_MODELS,
                default=settings.DEFAULT_MODEL_ALIAS,
                data_dir=settings.DATA_DIR,
            )
        return _registry_from_aliases()
    except RegistryError as exc:
        raise ImproperlyConfigured(f"INFERENCE_MODELS: {exc}") from exc


def _registry_from_aliases() -> Registry:
    """Today's settings as a registry: every alias on ``INFERENCE_BASE_URL``, one
    tokenizer, prices from ``MODEL_PRICES``."""
    tokenizer = TokenizerSpec(
        settings.TOKENIZER_BACKEND, tuple(sorted(settings.TOKENIZER_OPTIONS.items()))
    )
    upstream = settings.INFERENCE_BASE_URL.rstrip("/")
    entries = {
        alias: ModelEntry(
            alias=alias,
            upstreams=(upstream,),
            model=str(config["served_name"]),
            tokenizer=tokenizer,
            context_window=int(str(config["context_window"]))
            if config.get("context_window")
            else None,
            max_output_tokens=int(str(config["max_output_tokens"])),
            api_key=settings.INFERENCE_API_KEY or None,
            reasoning_opened=bool(config.get("reasoning_opened", False)),
            server=settings.INFERENCE_SERVER,
            unsupported=frozenset(settings.INFERENCE_UNSUPPORTED),
        )
        for alias, config in settings.MODEL_ALIASES.items()
    }
    return Registry(entries=entries, default=settings.DEFAULT_MODEL_ALIAS)


@receiver(setting_changed)
def _settings_changed(**_: Any) -> None:
    model_registry.cache_clear()


def model_aliases() -> list[str]:
    return [*model_registry().entries, AUTO]


def model_alias_resolve(*, alias: str | None) -> ModelEntry:
    """The entry for ``alias`` (none: the default; ``auto``: the first it routes to)."""
    registry = model_registry()
    if alias in (None, ""):
        return registry.entries[registry.default]
    if alias == AUTO:
        return auto_entries(registry)[0]
    entry = registry.get(alias)
    if entry is None:
        raise NotFound(
            f"The model {alias!r} does not exist; use one of {model_aliases()}.",
            code="model_not_found",
            param="model",
        )
    return entry


def auto_entries(registry: Registry) -> list[ModelEntry]:
    """The entries ``auto`` routes between, in order; the default alone when neither is
    configured."""
    found = [entry for alias in AUTO_ALIASES if (entry := registry.get(alias)) is not None]
    return found or [registry.entries[registry.default]]


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


def tokenizer(alias: str | None = None) -> Tokenizer:
    """The tokenizer of the model ``alias`` names (loaded once per process, on first use)."""
    return model_alias_resolve(alias=alias).tokenizer.load()


@dataclass(frozen=True)
class TokenCount:
    model: str
    tokens: int


def text_count(*, alias: str | None, text: str) -> TokenCount:
    """``text``'s tokens with the tokenizer of the model ``alias`` names."""
    entry = model_alias_resolve(alias=alias)
    return TokenCount(model=entry.alias, tokens=entry.tokenizer.load().count(text) if text else 0)


def worst_cost(spec: ModelSpec, *, prompt: int, output: int) -> Decimal:
    """The most ``prompt`` tokens and ``output`` more may cost if ``spec`` serves them: at
    the dearest price of its alias and every alias it falls back to, the prompt all
    uncached or all cached (whichever an operator priced higher)."""
    return max(
        cost_of(
            model=entry.alias, prompt=prompt, cached=cached, completion=output, price=entry.price
        )
        for entry in model_registry().chain(spec.alias)
        for cached in (0, prompt)
    )
