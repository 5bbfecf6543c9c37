"""Which models may serve an answer, before anything is reserved, which one does, and why.

The candidates of the alias asked for are narrowed three times: to those the caller's
allow-list permits, with every alias they fall back to (:func:`models_permitting`, else
403 ``model_not_allowed``), to those that allow ``max_tokens`` (:func:`models_allowing`),
then to those whose server, and every fallback's, honours the sampling and tool fields set
(:func:`models_honouring`); with ``auto`` a model that cannot is passed over, with a fixed
alias it is a 400. Then the first whose window holds the prompt admits it
(:func:`first_fitting`), and ``auto`` picks the model once its passages are in, with the
router ``ROUTER`` names (:mod:`.routers`).

Each answer's ledger row says why its alias served (``UsageRecord.route_reason``). When
several reasons apply, the first of these wins:

1. ``fallback`` / ``breaker``: another alias served than the one routed to, because a
   request to it failed before the first token / because every one of its upstreams had
   its circuit open (:func:`~.routers.route_reason_served`). What happened at the tier
   outranks what was planned.
2. ``requested``: a fixed alias was asked for; nothing was chosen.
3. With ``auto`` and two candidates or more left, the router's reason; the default
   router's are ``prompt_long`` (over ``ROUTER_SMALL_MAX_PROMPT_TOKENS``), then
   ``passages_dropped`` (short, but the small model could not hold every passage), then
   ``prompt_short``.
4. With ``auto`` and one candidate left, the first step that passed one over, in the order
   they run: ``allow_list``, ``max_tokens``, ``unsupported_field``, ``window``
   (:func:`candidates_narrow`, :func:`first_fitting`). It names what took the choice away,
   even where the router would have chosen the same model. ``only_candidate``: ``auto``
   had one model to begin with (no ``large`` configured).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from apps.chat.services.registry import (
    ModelSpec,
    model_registry,
    output_tokens_resolve,
)
from apps.chat.services.routers import RouteReason
from apps.core.exceptions import InvalidRequest, PermissionDenied
from inference import (
    ContextLengthExceeded,
    ModelEntry,
    Prompt,
    Sampling,
    Tools,
    sampling_refused,
    tools_refused,
)


def models_allowing(
    candidates: list[ModelSpec], *, max_tokens: int | None, cap: int | None
) -> list[ModelSpec]:
    """The models that allow ``max_tokens``: with ``auto``, one that cannot is passed over
    (asking for more than the small model writes is a reason to take the large one)."""
    allowed: list[ModelSpec] = []
    refusal: InvalidRequest | None = None
    for spec in candidates:
        try:
            output_tokens_resolve(spec=spec, max_tokens=max_tokens, cap=cap)
        except InvalidRequest as exc:
            refusal = refusal or exc
        else:
            allowed.append(spec)
    if not allowed:
        assert refusal is not None  # noqa: S101 - a candidate exists, so one refused
        raise refusal
    return allowed


class ModelNotAllowed(PermissionDenied):
    code = "model_not_allowed"


def models_permitting(
    candidates: list[ModelSpec], permitted: frozenset[str] | None
) -> list[ModelSpec]:
    """The candidates the caller's allow-list (:func:`apps.usage.limits.models_permitted`)
    lets it use, each with every alias it falls back to: with ``auto`` one it may not use
    is passed over, with a fixed alias it is a 403 ``model_not_allowed`` (a fallback to an
    alias it may not use would otherwise answer it)."""
    if permitted is None:
        return candidates
    registry = model_registry()
    kept = [
        spec
        for spec in candidates
        if all(entry.alias in permitted for entry in registry.chain(spec.alias))
    ]
    if not kept:
        names = ", ".join(sorted(permitted)) or "none"
        raise ModelNotAllowed(
            f"model: {candidates[0].alias} is not among the models you may use ({names}).",
            param="model",
        )
    return kept


def models_honouring(
    candidates: list[ModelSpec], sampling: Sampling, tools: Tools | None = None
) -> list[ModelSpec]:
    """The candidates whose server, and every fallback's, honours each sampling and tool
    field set.
    With ``auto`` one that cannot is passed over, as for ``max_tokens``; a fallback that
    cannot rules its alias out, since the answer would otherwise be generated without the
    field whenever the fallback serves it. None left: 400 ``unsupported_parameter`` naming
    the field, before anything is reserved."""
    if not sampling.fields() and tools is None:
        return candidates
    refused: str | None = None
    kept: list[ModelSpec] = []
    for spec in candidates:
        chain = model_registry().chain(spec.alias)
        field_name = next(
            (name for entry in chain if (name := _refused(entry, sampling, tools))), None
        )
        if field_name is None:
            kept.append(spec)
        refused = refused or field_name
    if not kept:
        raise InvalidRequest(
            f"{refused}: the model's inference server cannot honour this parameter.",
            code="unsupported_parameter",
            param=refused,
        )
    return kept


def _refused(entry: ModelEntry, sampling: Sampling, tools: Tools | None) -> str | None:
    """The first field set that ``entry``'s upstreams cannot honour: one its operator
    declared (``unsupported``), or one its server never can."""
    asked = [*sampling.fields(), *(tools.fields() if tools is not None else ())]
    declared = next((name for name in asked if name in entry.unsupported), None)
    server = entry.server
    return declared or sampling_refused(server, sampling) or tools_refused(server, tools)


def first_fitting(
    candidates: list[ModelSpec], assemble: Callable[[ModelSpec], Prompt]
) -> tuple[ModelSpec, Prompt]:
    """The first candidate whose window holds the prompt, and that prompt."""
    for spec in candidates[:-1]:
        try:
            return spec, assemble(spec)
        except ContextLengthExceeded:
            continue
    return candidates[-1], assemble(candidates[-1])


@dataclass(frozen=True, slots=True)
class Narrowed:
    """The candidates left, and the reason of the first step that passed one over ("":
    none did)."""

    candidates: list[ModelSpec]
    reason: str


def candidates_narrow(
    candidates: list[ModelSpec],
    *,
    permitted: frozenset[str] | None,
    max_tokens: int | None,
    cap: int | None,
    sampling: Sampling,
    tools: Tools | None,
) -> Narrowed:
    """:func:`models_permitting`, :func:`models_allowing` and :func:`models_honouring` in
    turn (each may refuse the request), remembering which passed a candidate over first."""
    steps: list[tuple[str, Callable[[list[ModelSpec]], list[ModelSpec]]]] = [
        (RouteReason.ALLOW_LIST, lambda found: models_permitting(found, permitted)),
        (
            RouteReason.MAX_TOKENS,
            lambda found: models_allowing(found, max_tokens=max_tokens, cap=cap),
        ),
        (RouteReason.UNSUPPORTED_FIELD, lambda found: models_honouring(found, sampling, tools)),
    ]
    reason = ""
    for code, narrow in steps:
        kept = narrow(candidates)
        if len(kept) < len(candidates):
            reason = reason or code
        candidates = kept
    return Narrowed(candidates, reason)
