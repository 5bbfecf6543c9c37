"""Which models may serve an answer, before anything is reserved, and which one does.

The candidates of the alias asked for are narrowed three times: to those the caller's
allow-list permits, with every alias they fall back to (:func:`models_permitting`, else
403 ``model_not_allowed``), to those that allow ``max_tokens`` (:func:`models_allowing`),
then to those whose server, and every fallback's, honours the sampling and tool fields set
(:func:`models_honouring`); with ``auto`` a model that cannot is passed over, with a fixed
alias it is a 400. Then the
first whose window holds the prompt admits it (:func:`first_fitting`), and ``auto`` picks
the model by the prompt's size once its passages are in (:func:`auto_route`).
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings

from apps.chat.services.registry import (
    ModelSpec,
    model_registry,
    output_tokens_resolve,
)
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


def auto_route(
    candidates: list[ModelSpec],
    prompt: Prompt,
    assemble: Callable[[ModelSpec], Prompt],
    *,
    offered: int,
) -> tuple[ModelSpec, Prompt]:
    """``auto``: the small model (first) keeps a prompt of at most
    ``ROUTER_SMALL_MAX_PROMPT_TOKENS`` tokens that it holds whole (no passage dropped to
    fit); otherwise the next model takes it, assembled with its own tokenizer."""
    small = candidates[0]
    fits_whole = len(prompt.passages) == offered
    if prompt.prompt_tokens <= settings.ROUTER_SMALL_MAX_PROMPT_TOKENS and fits_whole:
        return small, prompt
    if len(candidates) < 2:
        return small, prompt
    large = candidates[1]
    return large, assemble(large)
