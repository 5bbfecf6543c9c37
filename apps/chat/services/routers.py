"""The ``auto`` router: which of the candidates left serves an answer, and why.

``ROUTER`` names it by dotted path (:func:`router`): a class, or any callable taking no
argument, that makes an object with :meth:`Router.route`. The default,
:class:`PromptLengthRouter`, keeps the small model for a short prompt that it holds whole.
A router sees only what answer preparation hands it (the candidates, at least two, in order
of preference; the prompt assembled for the first with the passages found; an assembler
for another candidate; how many passages were offered) and returns a :class:`Route`: the
model, its prompt and a short stable reason, which the ledger keeps
(``UsageRecord.route_reason``). Which reason wins when several apply is :mod:`.routing`'s.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from apps.chat.services.registry import ModelSpec
from inference import Prompt, Target


class RouteReason(StrEnum):
    """Why the alias that served did (the codes the ledger keeps; see :mod:`.routing`)."""

    REQUESTED = "requested"
    PROMPT_SHORT = "prompt_short"
    PROMPT_LONG = "prompt_long"
    PASSAGES_DROPPED = "passages_dropped"
    ALLOW_LIST = "allow_list"
    MAX_TOKENS = "max_tokens"
    UNSUPPORTED_FIELD = "unsupported_field"
    WINDOW = "window"
    ONLY_CANDIDATE = "only_candidate"
    FALLBACK = "fallback"
    BREAKER = "breaker"


REASON_FORMAT = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""What a reason may be: a lowercase code that fits ``UsageRecord.route_reason``."""

Assemble = Callable[[ModelSpec], Prompt]
"""The answer's prompt, passages included, assembled and counted for another model."""


@dataclass(frozen=True, slots=True)
class Route:
    """The model that serves, the prompt it is sent, and why it was chosen."""

    spec: ModelSpec
    prompt: Prompt
    reason: str

    def __post_init__(self) -> None:
        if not REASON_FORMAT.fullmatch(self.reason):
            raise ValueError(f"a route reason is a short code like 'prompt_long': {self.reason!r}")


class Router(Protocol):
    def route(
        self, candidates: Sequence[ModelSpec], prompt: Prompt, assemble: Assemble, *, offered: int
    ) -> Route:
        """One of ``candidates`` (``prompt`` is for the first; ``assemble`` makes another's),
        ``offered`` passages having been found; a reason of :data:`REASON_FORMAT`."""
        ...


class PromptLengthRouter:
    """The small model (first) keeps a prompt of at most ``ROUTER_SMALL_MAX_PROMPT_TOKENS``
    tokens that it holds whole (no passage dropped to fit); otherwise the next model takes
    it, assembled with its own tokenizer. A prompt too long is ``prompt_long`` even when
    passages were dropped too: a larger window would not have made it short."""

    def route(
        self, candidates: Sequence[ModelSpec], prompt: Prompt, assemble: Assemble, *, offered: int
    ) -> Route:
        small, large = candidates[0], candidates[1]
        if prompt.prompt_tokens > settings.ROUTER_SMALL_MAX_PROMPT_TOKENS:
            return Route(large, assemble(large), RouteReason.PROMPT_LONG)
        if len(prompt.passages) < offered:
            return Route(large, assemble(large), RouteReason.PASSAGES_DROPPED)
        return Route(small, prompt, RouteReason.PROMPT_SHORT)


def auto_route(
    candidates: Sequence[ModelSpec], prompt: Prompt, assemble: Assemble, *, offered: int
) -> Route:
    """What the configured router (``ROUTER``) makes of two or more candidates; one that
    picks a model not among them is a configuration error, not the caller's."""
    route = router().route(candidates, prompt, assemble, offered=offered)
    if route.spec not in candidates:
        raise ImproperlyConfigured(
            f"ROUTER {settings.ROUTER} chose {route.spec.alias!r}, which is not a candidate"
        )
    return route


def router() -> Router:
    """The router ``ROUTER`` names, made once per dotted path."""
    return _router(settings.ROUTER)


@functools.cache
def _router(path: str) -> Router:
    try:
        made: object = import_string(path)()
    except ImportError as exc:
        raise ImproperlyConfigured(f"ROUTER: cannot import {path!r}: {exc}") from exc
    if not callable(getattr(made, "route", None)):
        raise ImproperlyConfigured(f"ROUTER: {path!r} makes no object with a route() method")
    return cast(Router, made)


def route_reason_served(reason: str, *, routed: str, served: str, tried: Sequence[Target]) -> str:
    """The ledger's reason once the tier has answered: the routing's, unless another alias
    served than the one routed to: ``fallback`` when a request to the routed alias failed,
    ``breaker`` when every one of its upstreams was skipped with its circuit open."""
    if served == routed:
        return reason
    if any(target.alias == routed for target in tried):
        return RouteReason.FALLBACK
    return RouteReason.BREAKER
