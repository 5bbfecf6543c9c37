"""Everything an answer needs before the tier is called, and that can refuse it.

Validation of ``max_tokens``, the history read, prompt assembly counted with the
tokenizer of the model that will serve (``context_length_exceeded`` here, the model never
called), admission (one reservation held against every token limit, 429 here),
retrieval, and ``auto`` routing: the small model when the assembled prompt, passages
included, is at most ``ROUTER_SMALL_MAX_PROMPT_TOKENS`` tokens, else the large one.
Nothing is written but the reservation: the message rows are written while the tier
prefills.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps.accounts.selectors import Caller
from apps.chat.models import Conversation
from apps.chat.selectors import conversation_history
from apps.chat.services.cache import response_cache_key
from apps.chat.services.models import ModelChoice, ModelSpec, output_tokens_resolve
from apps.core.exceptions import InvalidRequest
from apps.knowledge.services import (
    DEFAULT_SEARCH_MODE,
    SearchFilters,
    SearchMode,
    SearchResult,
    chunk_search,
)
from apps.usage import metrics
from apps.usage.budgets import (
    budget_extend,
    budget_reserve,
    budget_settle,
    limits_cache,
    max_tokens_cap,
)
from apps.usage.models import Reservation
from inference import (
    SYSTEM_PROMPT,
    ChatMessage,
    ChatRequest,
    ContextLengthExceeded,
    Passage,
    Prompt,
    assemble_prompt,
)

HISTORY_MESSAGES = 40


@dataclass
class PreparedAnswer:
    caller: Caller
    conversation: Conversation | None
    """None: a new one, made with the messages (the OpenAI surface keeps no history)."""
    question: str
    spec: ModelSpec
    """The model that serves first (after ``auto`` routing; fallback may move on)."""
    prompt: Prompt
    max_tokens: int
    citations: list[dict[str, Any]]
    reservation: Reservation | None
    """None when the caller has no limits: nothing to hold, nothing to settle."""
    want_reasoning: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    store: bool = True
    """False: no conversation, message or event is written; the usage row still is."""
    cache_key: str | None = None
    """The response cache's key for this answer; None: not cached (a conversation with
    history, ``cache: false``, the cache off)."""
    requested: str = ""
    """The alias the caller named (``auto`` stays ``auto``), for the ledger."""
    opening: str = ""
    """The system prompt and the first question of the exchange: the head of the prompt,
    the same on every turn, so a client that keeps no conversation here still sticks to
    one upstream (and its prefix cache)."""

    @property
    def request(self) -> ChatRequest:
        return ChatRequest(
            model=self.spec.served_name,
            messages=self.prompt.messages,
            max_tokens=self.max_tokens,
            extra=self.extra,
            reasoning_opened=self.spec.reasoning_opened,
        )


def answer_prepare(
    *,
    caller: Caller,
    conversation: int | None,
    content: str,
    model: ModelChoice,
    collection_ids: list[int] | None = None,
    max_tokens: int | None = None,
    top_k: int = 5,
    rag: bool = True,
    search_mode: SearchMode = DEFAULT_SEARCH_MODE,
    search_filters: SearchFilters | None = None,
    want_reasoning: bool = False,
    history: list[ChatMessage] | None = None,
    instructions: str = "",
    store: bool = True,
    cache: bool = True,
) -> PreparedAnswer:
    """Admit, retrieve, assemble and route. Raises before any byte; holds a reservation
    after.

    ``conversation``: the id of one of the caller's (another team's is a 404), or None for
    a new one, written with the messages. ``model``: the alias, or for ``auto`` the models it
    routes between. ``history`` replaces the conversation's stored turns (the
    OpenAI-compatible surface sends its own); ``instructions`` (a client's system
    message) follow the system prompt. ``search_mode`` and ``search_filters`` are those of
    :func:`apps.knowledge.services.chunk_search`. ``store`` False (a new conversation only)
    keeps nothing of the exchange but its usage row. ``cache`` False skips the response
    cache; it applies only to single-turn questions (no history).
    """
    existing: Conversation | None = None
    if conversation is not None:
        existing, stored = conversation_history(
            team=caller.team, conversation_id=conversation, limit=HISTORY_MESSAGES
        )
        history = stored if history is None else history
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key)
    cap = max_tokens_cap(limits=limits)
    candidates = _candidates(model, max_tokens=max_tokens, cap=cap)
    started = time.monotonic()
    history = history or []
    system = f"{SYSTEM_PROMPT}\n\n{instructions}" if instructions else SYSTEM_PROMPT

    def assembled(spec: ModelSpec, passages: list[Passage]) -> Prompt:
        try:
            return assemble_prompt(
                tokenizer=spec.tokenizer,
                question=content,
                passages=passages,
                history=history,
                system=system,
                context_window=spec.context_window,
                max_output_tokens=output_tokens_resolve(spec=spec, max_tokens=max_tokens, cap=cap),
                max_chars_per_token=settings.MAX_CHARS_PER_TOKEN,
            )
        except ContextLengthExceeded:
            metrics.CONTEXT_LENGTH_EXCEEDED.inc()
            raise

    # Admission, before anything is embedded or generated: the prompt without passages
    # plus every output token it may generate, held atomically against every limit (429
    # here, never mid-stream). Passages only add tokens, so the bare prompt is a floor.
    # A caller with no limits at all has nothing to hold: no reservation, no write.
    # The hold is exact, so counting comes first, bounded: the surfaces cap how many
    # messages and how long (before any count), and fitting takes O(log n) counts of at
    # most the window's worth of characters (``MAX_CHARS_PER_TOKEN`` a token).
    spec, bare = _first_fitting(candidates, lambda spec: assembled(spec, []))
    held = bare.prompt_tokens + output_tokens_resolve(spec=spec, max_tokens=max_tokens, cap=cap)
    reservation = (
        budget_reserve(
            team=caller.team,
            api_key=caller.api_key,
            tokens=held,
            limits=limits,
            defer_record=True,  # written with the message rows, while the tier prefills
        )
        if limits
        else None
    )
    try:
        collections = collection_ids
        if collections is None and existing is not None:
            collections = existing.collection_ids
        results: list[SearchResult] = []
        if rag:
            results = chunk_search(
                caller=caller,
                query=content,
                collection_ids=collections or None,
                top_k=top_k,
                mode=search_mode,
                filters=search_filters,
            )
        passages = [
            Passage(r.chunk.document.title, r.chunk.text, tuple(r.chunk.headings)) for r in results
        ]
        prompt = assembled(spec, passages) if passages else bare
        if model.routed:
            spec, prompt = _route(
                candidates[candidates.index(spec) :],
                prompt,
                lambda spec: assembled(spec, passages),
                offered=len(passages),
            )
        output_tokens = output_tokens_resolve(spec=spec, max_tokens=max_tokens, cap=cap)
        cache_key = None
        if cache and not history and settings.RESPONSE_CACHE_TTL > 0:
            cache_key = response_cache_key(
                team=caller.team,
                question=content,
                alias=spec.alias,  # the routed one: ``auto`` keys as what serves it
                max_tokens=output_tokens,
                collection_ids=(collections or None) if rag else [],
                search={"mode": search_mode, "filters": search_filters, "top_k": top_k},
                sampling={},  # none is taken from callers yet: the tier's defaults
                instructions=instructions,
                reasoning=want_reasoning,
            )
        metrics.RETRIEVAL.observe(time.monotonic() - started)
        if reservation is not None:  # the passages' tokens, on the same hold, all or nothing
            extra = prompt.prompt_tokens + output_tokens - held
            budget_extend(reservation=reservation, tokens=extra)
    except BaseException:
        if reservation is not None:
            budget_settle(reservation=reservation, actual=0)
        raise
    return PreparedAnswer(
        caller=caller,
        conversation=existing,
        question=content,
        spec=spec,
        prompt=prompt,
        max_tokens=output_tokens,
        citations=[
            _citation(number, result)
            for number, result in enumerate(results[: len(prompt.passages)], start=1)
        ],
        reservation=reservation,
        want_reasoning=want_reasoning,
        store=store or existing is not None,
        cache_key=cache_key,
        requested=model.requested,
        opening=f"{system}\0{history[0]['content'] if history else content}",
    )


def _candidates(model: ModelChoice, *, max_tokens: int | None, cap: int | None) -> list[ModelSpec]:
    """The models that allow ``max_tokens``: with ``auto``, one that cannot is passed over
    (asking for more than the small model writes is a reason to take the large one)."""
    allowed: list[ModelSpec] = []
    refusal: InvalidRequest | None = None
    for spec in model.candidates:
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


def _first_fitting(
    candidates: list[ModelSpec], assemble: Callable[[ModelSpec], Prompt]
) -> tuple[ModelSpec, Prompt]:
    """The first candidate whose window holds the prompt, and that prompt."""
    for spec in candidates[:-1]:
        try:
            return spec, assemble(spec)
        except ContextLengthExceeded:
            continue
    return candidates[-1], assemble(candidates[-1])


def _route(
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


def _citation(number: int, result: SearchResult) -> dict[str, Any]:
    chunk = result.chunk
    return {
        "id": number,
        "chunk_id": chunk.pk,
        "document_id": chunk.document_id,
        "collection_id": chunk.collection_id,
        "title": chunk.document.title,
        "chunk_index": chunk.index,
        "score": round(result.score, 6),
        "snippet": result.snippet,
    }
