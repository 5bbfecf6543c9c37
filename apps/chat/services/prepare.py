"""Everything an answer needs before the tier is called, and that can refuse it.

Validation of ``max_tokens``, the history read, prompt assembly counted with the served
model's tokenizer (``context_length_exceeded`` here, the model never called), admission
(one reservation held against every token limit, 429 here) and retrieval. Nothing is
written but the reservation: the message rows are written while the tier prefills.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps.accounts.selectors import Caller
from apps.chat.models import Conversation, Message
from apps.chat.selectors import conversation_get
from apps.chat.services.cache import response_cache_key
from apps.chat.services.models import ModelSpec, output_tokens_resolve, tokenizer
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

    @property
    def request(self) -> ChatRequest:
        return ChatRequest(
            model=self.spec.served_name,
            messages=self.prompt.messages,
            max_tokens=self.max_tokens,
            extra=self.extra,
            reasoning_opened=self.spec.reasoning_opened,
        )


def history_of(conversation: Conversation) -> list[ChatMessage]:
    """The most recent completed turns, oldest first, as chat messages. Older ones would not
    fit a context window anyway; prompt assembly drops more if it must."""
    turns = conversation.messages.exclude(status=Message.Status.STREAMING).exclude(content="")
    recent = list(turns.order_by("-created_at", "-pk")[:HISTORY_MESSAGES])
    while recent and recent[-1].role == Message.Role.ASSISTANT:
        recent.pop()  # a history starts with a question
    return [{"role": m.role, "content": m.content} for m in reversed(recent)]


def answer_prepare(
    *,
    caller: Caller,
    conversation: Conversation | int | None,
    content: str,
    spec: ModelSpec,
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
    """Admit, retrieve and assemble. Raises before any byte; holds a reservation after.

    ``conversation``: the caller's (or its id; another team's is a 404), or None for a new
    one, written with the messages. ``history`` replaces the conversation's stored turns
    (the OpenAI-compatible surface sends its own); ``instructions`` (a client's system
    message) follow the system prompt. ``search_mode`` and ``search_filters`` are those of
    :func:`apps.knowledge.services.chunk_search`. ``store`` False (a new conversation only)
    keeps nothing of the exchange but its usage row. ``cache`` False skips the response
    cache; it applies only to single-turn questions (no history).
    """
    if isinstance(conversation, int):
        conversation = conversation_get(team=caller.team, conversation_id=conversation)
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key)
    output_tokens = output_tokens_resolve(
        spec=spec, max_tokens=max_tokens, cap=max_tokens_cap(limits=limits)
    )
    started = time.monotonic()
    if history is None:
        history = history_of(conversation) if conversation is not None else []

    def assembled(passages: list[Passage]) -> Prompt:
        try:
            return assemble_prompt(
                tokenizer=tokenizer(),
                question=content,
                passages=passages,
                history=history,
                system=f"{SYSTEM_PROMPT}\n\n{instructions}" if instructions else SYSTEM_PROMPT,
                context_window=spec.context_window,
                max_output_tokens=output_tokens,
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
    bare = assembled([])
    reservation = (
        budget_reserve(
            team=caller.team,
            api_key=caller.api_key,
            tokens=bare.prompt_tokens + output_tokens,
            limits=limits,
            defer_record=True,  # written with the message rows, while the tier prefills
        )
        if limits
        else None
    )
    try:
        collections = collection_ids
        if collections is None and conversation is not None:
            collections = conversation.collection_ids
        cache_key = None
        if cache and not history and settings.RESPONSE_CACHE_TTL > 0:
            cache_key = response_cache_key(
                team=caller.team,
                question=content,
                alias=spec.alias,
                max_tokens=output_tokens,
                collection_ids=(collections or None) if rag else [],
                search={"mode": search_mode, "filters": search_filters, "top_k": top_k},
                sampling={},  # none is taken from callers yet: the tier's defaults
                instructions=instructions,
                reasoning=want_reasoning,
            )
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
        prompt = assembled(passages) if passages else bare
        metrics.RETRIEVAL.observe(time.monotonic() - started)
        if reservation is not None:  # the passages' tokens, on the same hold, all or nothing
            budget_extend(reservation=reservation, tokens=prompt.prompt_tokens - bare.prompt_tokens)
    except BaseException:
        if reservation is not None:
            budget_settle(reservation=reservation, actual=0)
        raise
    return PreparedAnswer(
        caller=caller,
        conversation=conversation,
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
        store=store or conversation is not None,
        cache_key=cache_key,
    )


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
