"""Everything an answer needs before the tier is called, and that can refuse it.

One :class:`~.request.AnswerRequest` in, one :class:`PreparedAnswer` out, in steps: the
history read, the candidates that allow ``max_tokens``, prompt assembly counted with the
tokenizer of the model that will serve (``context_length_exceeded`` here, the model never
called), admission (one reservation held against every token limit, 429 here),
retrieval, ``auto`` routing (by the router ``ROUTER`` names: :mod:`.routers`; why the
model was chosen is kept for the ledger: :mod:`.routing`) and the response cache's key.
Nothing is written but the reservation: the message rows are written while the tier
prefills.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from apps.accounts.selectors import Caller
from apps.chat.models import Conversation
from apps.chat.response_cache import response_cache_key
from apps.chat.selectors import conversation_history
from apps.chat.services.compaction import (
    NOTHING,
    Compacted,
    Overflow,
    history_compact,
    left_out_tokens,
)
from apps.chat.services.registry import AUTO, ModelSpec, output_tokens_resolve, worst_cost
from apps.chat.services.request import AnswerRequest
from apps.chat.services.routers import Route, RouteReason, auto_route
from apps.chat.services.routing import candidates_narrow, first_fitting
from apps.chat.services.types import Citation
from apps.knowledge.services import SearchResult, chunk_search
from apps.usage import metrics
from apps.usage.budgets import (
    budget_extend,
    budget_reserve,
    budget_settle,
    limits_cache,
    max_tokens_cap,
    models_permitted,
)
from apps.usage.models import Limit, Reservation
from inference import (
    SYSTEM_PROMPT,
    ChatMessage,
    ChatRequest,
    ContextLengthExceeded,
    Passage,
    Prompt,
    Sampling,
    Tools,
    assemble_prompt,
    summary_system,
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
    citations: list[Citation]
    reservation: Reservation | None
    """None when the caller has no limits: nothing to hold, nothing to settle."""
    held: int = 0
    """The tokens its reservation holds (or would: :func:`answer_prepare_unheld`)."""
    held_cost: Decimal = Decimal(0)
    """What they may cost at most: the money its reservation holds."""
    want_reasoning: bool = False
    sampling: Sampling = field(default_factory=Sampling)
    """What the caller chose of the sampling, written in each server's dialect."""
    extra: dict[str, Any] = field(default_factory=dict)
    tools: Tools | None = None
    store: bool = True
    """False: no conversation, message or event is written; the usage row still is."""
    cache_key: str | None = None
    """The response cache's key for this answer; None: not cached (a conversation with
    history, ``cache: false``, the cache off)."""
    requested: str = ""
    """The alias the caller named (``auto`` stays ``auto``), for the ledger."""
    route_reason: str = ""
    """Why :attr:`spec` was routed to (:mod:`.routing`), for the ledger."""
    stream_grace: float | None = None
    """:attr:`AnswerRequest.stream_grace`."""
    dropped_passages: int = 0
    """Passages found that the window left out."""
    dropped_turns: int = 0
    """History messages the window left out."""
    summarized_turns: int = 0
    """History messages a summary replaced (:mod:`.compaction`)."""
    dropped_tokens: int = 0
    """The tokens the passages and turns left out or summarised would have taken."""
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
            sampling=self.sampling,
            tools=self.tools,
            server=self.spec.entry.server,
            extra=self.extra,
            reasoning_opened=self.spec.reasoning_opened,
        )


def answer_prepare(*, request: AnswerRequest) -> PreparedAnswer:
    """Admit, retrieve, assemble and route ``request``. Raises before any byte; holds a
    reservation after (unless the caller has no limits), settled at nothing on any
    failure here."""
    admitted = _admit(request)
    try:
        return _ground(admitted)
    except BaseException:
        if admitted.reservation is not None:
            budget_settle(reservation=admitted.reservation, actual=0)
        raise


def answer_prepare_unheld(*, request: AnswerRequest) -> PreparedAnswer:
    """What :func:`answer_prepare` would make of ``request``, holding nothing: the same
    checks, retrieval (its query embedding charged, as any search's), prompt and routing,
    for an estimate (:mod:`.estimate`)."""
    return _ground(_admit(request, hold=False))


@dataclass(frozen=True, slots=True)
class _Admitted:
    """An answer admitted: its prompt without passages fits ``candidates[0]``, and that
    prompt's tokens plus every output token it may generate are ``held``."""

    request: AnswerRequest
    conversation: Conversation | None
    assemble: _Assembler
    candidates: list[ModelSpec]
    bare: Prompt
    held: int
    cost: Decimal
    """The most the held tokens may cost, at the dearest price that may serve them."""
    reservation: Reservation | None
    started: float
    narrowed: str
    """The reason of the first step that passed a candidate over ("": none did)."""


def _admit(request: AnswerRequest, *, hold: bool = True) -> _Admitted:
    """Admission, before anything is embedded or generated: the prompt without passages
    plus every output token it may generate, held atomically against every limit (429
    here, never mid-stream). Passages only add tokens, so the bare prompt is a floor.

    The hold is exact, so counting comes first, bounded: the surfaces cap how many
    messages and how long (before any count), and fitting takes O(log n) counts of at
    most the window's worth of characters (``MAX_CHARS_PER_TOKEN`` a token)."""
    conversation, history = _history(request)
    caller = request.caller
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key, tag=caller.tag)
    cap = max_tokens_cap(limits=limits)
    narrowed = candidates_narrow(
        list(request.model.candidates),
        permitted=models_permitted(limits=limits),
        max_tokens=request.max_tokens,
        cap=cap,
        sampling=request.tier_sampling,
        tools=request.tools,
    )
    candidates = narrowed.candidates
    started = time.monotonic()
    assemble = _Assembler(request, history=history, cap=cap)
    spec, bare = first_fitting(candidates, assemble)
    bare = assemble.compact(spec, bare, conversation=conversation, build=hold)
    remaining = candidates[candidates.index(spec) :]
    held = bare.prompt_tokens + assemble.output_tokens(spec)
    cost = max(
        worst_cost(c, prompt=bare.prompt_tokens, output=assemble.output_tokens(c))
        for c in remaining
    )
    reservation = _reserve(caller, tokens=held, cost=cost, limits=limits) if hold else None
    reason = narrowed.reason or (RouteReason.WINDOW if spec != candidates[0] else "")
    return _Admitted(
        request,
        conversation,
        assemble,
        remaining,
        bare,
        held,
        cost,
        reservation,
        started,
        reason,
    )


def _ground(admitted: _Admitted) -> PreparedAnswer:
    """Retrieval, the prompt with its passages, routing and the response cache's key; the
    passages' tokens join the hold, all or nothing."""
    request, assemble = admitted.request, admitted.assemble
    collections, results = _retrieve(request, admitted.conversation)
    route = _routed(admitted, results)
    spec, prompt = route.spec, route.prompt
    output_tokens = assemble.output_tokens(spec)
    cache_key = _cache_key(request, assemble.history, spec, output_tokens, collections)
    metrics.RETRIEVAL.observe(time.monotonic() - admitted.started)
    held = prompt.prompt_tokens + output_tokens
    cost = worst_cost(spec, prompt=prompt.prompt_tokens, output=output_tokens)
    if admitted.reservation is not None:
        budget_extend(
            reservation=admitted.reservation,
            tokens=held - admitted.held,
            cost=cost - admitted.cost,
        )
    history, covered = assemble.history, assemble.compacted.covered
    left_out = len(history) - prompt.history_messages
    return PreparedAnswer(
        caller=request.caller,
        conversation=admitted.conversation,
        question=request.content,
        spec=spec,
        prompt=prompt,
        max_tokens=output_tokens,
        citations=_citations(results[: len(prompt.passages)]),
        reservation=admitted.reservation,
        held=max(held, admitted.held),
        held_cost=max(cost, admitted.cost),
        want_reasoning=request.want_reasoning,
        sampling=request.tier_sampling,
        tools=request.tools,
        store=request.store or admitted.conversation is not None,
        cache_key=cache_key,
        requested=request.model.requested,
        route_reason=route.reason,
        stream_grace=request.stream_grace,
        dropped_passages=len(results) - len(prompt.passages),
        dropped_turns=left_out - covered,
        summarized_turns=covered,
        dropped_tokens=left_out_tokens(
            spec.tokenizer,
            passages=results[len(prompt.passages) :],
            first=len(prompt.passages) + 1,
            turns=history[:left_out],
        ),
        opening=f"{assemble.system}\0{history[0]['content'] if history else request.content}",
    )


def _history(request: AnswerRequest) -> tuple[Conversation | None, Sequence[ChatMessage]]:
    """The conversation named (another team's is a 404) and the turns the prompt carries:
    the request's own, else the conversation's latest ``HISTORY_MESSAGES``."""
    history: Sequence[ChatMessage] | None = request.history
    conversation: Conversation | None = None
    if request.conversation is not None:
        conversation, stored = conversation_history(
            team=request.caller.team, conversation_id=request.conversation, limit=HISTORY_MESSAGES
        )
        history = stored if history is None else history
    return conversation, history or []


class _Assembler:
    """This answer's prompt for any candidate model, with or without passages, counted
    with that model's tokenizer (``context_length_exceeded`` when the question alone does
    not fit)."""

    def __init__(
        self, request: AnswerRequest, *, history: Sequence[ChatMessage], cap: int | None
    ) -> None:
        self.question = request.content
        self.max_tokens = request.max_tokens
        self.history = history
        self.tail = request.tail
        self.tools = request.tools.definitions if request.tools is not None else ()
        self.cap = cap
        self.caller = request.caller
        self.compacted = NOTHING
        """The oldest turns' summary, when :meth:`compact` made or found one."""
        instructions = request.instructions
        self.system = f"{SYSTEM_PROMPT}\n\n{instructions}" if instructions else SYSTEM_PROMPT

    def output_tokens(self, spec: ModelSpec) -> int:
        return output_tokens_resolve(spec=spec, max_tokens=self.max_tokens, cap=self.cap)

    def compact(
        self, spec: ModelSpec, bare: Prompt, *, conversation: Conversation | None, build: bool
    ) -> Prompt:
        """``bare`` with the history it drops summarised, when ``HISTORY_POLICY`` says so
        (:func:`~.compaction.history_compact`); every later prompt carries that summary."""
        budget = spec.context_window - self.output_tokens(spec)
        whole = len(self.history) < HISTORY_MESSAGES - 1  # a cut read may lose a question
        overflow = Overflow(self.caller, conversation, self.history, spec, bare, budget, whole)
        self.compacted = history_compact(
            overflow, lambda compacted: self(spec, compacted=compacted), build=build
        )
        if self.compacted is NOTHING:
            return bare
        try:
            return self(spec)
        except ContextLengthExceeded:  # the summary leaves the question no room: drop
            self.compacted = NOTHING
            return bare

    def __call__(
        self,
        spec: ModelSpec,
        passages: Sequence[Passage] = (),
        *,
        compacted: Compacted | None = None,
    ) -> Prompt:
        if compacted is None:
            compacted = self.compacted
        try:
            return assemble_prompt(
                tokenizer=spec.tokenizer,
                question=self.question,
                passages=passages,
                history=self.history[compacted.covered :],
                system=summary_system(self.system, compacted.summary),
                context_window=spec.context_window,
                max_output_tokens=self.output_tokens(spec),
                max_chars_per_token=settings.MAX_CHARS_PER_TOKEN,
                tools=self.tools,
                tail=self.tail,
            )
        except ContextLengthExceeded:
            metrics.CONTEXT_LENGTH_EXCEEDED.inc()
            raise


def _reserve(
    caller: Caller, *, tokens: int, cost: Decimal, limits: list[Limit]
) -> Reservation | None:
    """``tokens`` costing at most ``cost`` held against every one of ``limits``, or 429. A
    caller with no limits at all has nothing to hold: no reservation, no write."""
    if not limits:
        return None
    return budget_reserve(
        team=caller.team,
        api_key=caller.api_key,
        tokens=tokens,
        cost=cost,
        limits=limits,
        defer_record=True,  # written with the message rows, while the tier prefills
    )


def _retrieve(
    request: AnswerRequest, existing: Conversation | None
) -> tuple[list[int] | None, list[SearchResult]]:
    """The collections searched (the request's, else the conversation's; None: every one
    the caller may read) and what the search found in them (nothing with RAG off)."""
    collections = None if request.collection_ids is None else list(request.collection_ids)
    if collections is None and existing is not None:
        collections = existing.collection_ids
    if not request.rag:
        return collections, []
    results = chunk_search(
        caller=request.caller,
        query=request.content,
        collection_ids=collections or None,
        top_k=request.top_k,
        mode=request.search_mode,
        filters=request.search_filters,
    )
    return collections, results


def _routed(admitted: _Admitted, results: list[SearchResult]) -> Route:
    """The prompt with the passages found, for the model that held it bare, then for
    ``auto`` the model that serves it (:func:`~.routers.auto_route`), and why (the
    precedence is :mod:`.routing`'s)."""
    passages = [
        Passage(r.chunk.document.title, r.chunk.text, tuple(r.chunk.headings)) for r in results
    ]
    candidates, assemble = admitted.candidates, admitted.assemble
    prompt = assemble(candidates[0], passages) if passages else admitted.bare
    if admitted.request.model.requested != AUTO:
        return Route(candidates[0], prompt, RouteReason.REQUESTED)
    if len(candidates) < 2:
        return Route(candidates[0], prompt, admitted.narrowed or RouteReason.ONLY_CANDIDATE)
    return auto_route(
        candidates, prompt, lambda spec: assemble(spec, passages), offered=len(passages)
    )


def _cache_key(
    request: AnswerRequest,
    history: Sequence[ChatMessage],
    spec: ModelSpec,
    output_tokens: int,
    collections: list[int] | None,
) -> str | None:
    """The response cache's key, or None: not cached (history, ``cache: false``, the cache
    off, tools (a call is no answer to replay), log probabilities (the entry keeps only
    the text), or sampled output asked for: :attr:`AnswerRequest.deterministic`)."""
    uncached = history or request.tools or request.tail or request.logprobs
    if not request.cache or uncached or settings.RESPONSE_CACHE_TTL <= 0:
        return None
    if not request.deterministic:
        return None
    return response_cache_key(
        team=request.caller.team,
        question=request.content,
        alias=spec.alias,  # the routed one: ``auto`` keys as what serves it
        max_tokens=output_tokens,
        collection_ids=(collections or None) if request.rag else [],
        search={
            "mode": request.search_mode,
            "filters": request.search_filters,
            "top_k": request.top_k,
        },
        sampling=request.sampling,
        instructions=request.instructions,
    )


def _citations(results: list[SearchResult]) -> list[Citation]:
    """The citations of the passages the prompt kept, numbered as the prompt numbers them."""
    return [_citation(number, result) for number, result in enumerate(results, start=1)]


def _citation(number: int, result: SearchResult) -> Citation:
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
