"""Context compaction: what becomes of the history an answer's window cannot hold, and
the tokens of what it left out.

``HISTORY_POLICY=drop`` leaves the oldest turns out. ``summarize`` replaces them with one
summary made by the small alias (:mod:`.summary_call`), cached per conversation
(:mod:`.summary_store`): reused while the turns it covers are unchanged, extended from
itself when more must be covered, rebuilt when a covered turn changed. A summary is
charged to the team like an answer: reserved before (its prompt plus its token bound, a
refusal failing the answer with the 429, as the answer would be refused by the same
limit), settled after, one ledger row with ``operation="summary"`` under the request's
tag. Only stored conversations are summarised: a request carrying its own history has
nowhere to keep a summary (docs/context.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction

from apps.accounts.selectors import Caller
from apps.chat.models import Conversation
from apps.chat.services.registry import ModelSpec, worst_cost
from apps.chat.services.summary_call import Generated, summary_generate, summary_model
from apps.chat.services.summary_store import (
    Summary,
    summary_claim,
    summary_complete,
    summary_find,
    summary_release,
)
from apps.knowledge.services import SearchResult
from apps.usage.budgets import budget_reserve, budget_settle, limits_cache, models_permitted
from apps.usage.models import Reservation, UsageRecord
from apps.usage.services import usage_cost, usage_record_chat
from inference import (
    ChatMessage,
    ContextLengthExceeded,
    CoverNeed,
    Passage,
    Prompt,
    Tokenizer,
    render_passage,
    summary_cover,
    summary_prompt,
    summary_room,
)


@dataclass(frozen=True, slots=True)
class Compacted:
    """The history's oldest ``covered`` turns replaced by ``summary`` (none: nothing)."""

    summary: str = ""
    covered: int = 0


NOTHING = Compacted()


@dataclass(frozen=True, slots=True)
class Overflow:
    """An answer whose history the window does not hold whole, as fitted without a summary."""

    caller: Caller
    conversation: Conversation | None
    history: Sequence[ChatMessage]
    spec: ModelSpec
    bare: Prompt
    """The prompt without passages, the oldest turns dropped to fit."""
    budget: int
    """The window less the answer's output tokens."""
    whole: bool = True
    """``history`` starts at the conversation's start (its read was not cut short)."""


def history_compact(
    overflow: Overflow, assemble: Callable[[Compacted], Prompt], *, build: bool
) -> Compacted:
    """What replaces the turns ``overflow.bare`` dropped: nothing (``drop``, no stored
    conversation, a build another answer holds), the cached summary when the turns after
    it fit, else (``build``; an estimate builds nothing) a new one."""
    history = overflow.history
    dropped = len(history) - overflow.bare.history_messages
    if not dropped or overflow.conversation is None or settings.HISTORY_POLICY != "summarize":
        return NOTHING
    cached = summary_find(conversation=overflow.conversation, history=history, whole=overflow.whole)
    kept = Compacted(cached.text, cached.covered) if cached is not None else NOTHING
    fits = cached is not None and _keeps_rest(assemble, kept, len(history) - cached.covered)
    if fits or not build:
        return kept
    covered = _cover(overflow, dropped)
    if not covered or (cached is not None and covered <= cached.covered):
        return kept
    return _build(overflow, history[:covered], cached) or kept


def _keeps_rest(assemble: Callable[[Compacted], Prompt], compacted: Compacted, rest: int) -> bool:
    """The prompt after ``compacted`` keeps the ``rest`` of the history whole."""
    try:
        return assemble(compacted).history_messages == rest
    except ContextLengthExceeded:  # the question grew past what the summary leaves
        return False


def _cover(overflow: Overflow, dropped: int) -> int:
    """How many of the oldest turns a new summary covers (:func:`inference.summary_cover`)."""
    tokenizer = overflow.spec.tokenizer
    counts = [_count(tokenizer, turn["content"]) for turn in overflow.history]
    need = CoverNeed(
        dropped=dropped,
        slack=overflow.budget - overflow.bare.prompt_tokens,
        summary=summary_room(tokenizer, settings.SUMMARY_MAX_TOKENS),
        keep_share=settings.SUMMARY_KEEP_SHARE,
    )
    return summary_cover(overflow.history, counts, need)


def _build(
    overflow: Overflow, turns: Sequence[ChatMessage], previous: Summary | None
) -> Compacted | None:
    """A summary of ``turns`` built, stored and charged; None when another answer is
    building it, the conversation is gone, or the caller may not use the summariser."""
    conversation = overflow.conversation
    assert conversation is not None  # noqa: S101 - history_compact summarises stored ones
    spec = async_to_sync(summary_model)()
    if not _permitted(overflow.caller, spec):
        return None
    claim = summary_claim(conversation=conversation, turns=turns)
    if claim is None:
        return None
    try:
        made = _summarise(overflow.caller, conversation, spec, turns, previous)
    except BaseException:
        summary_release(claim=claim)
        raise
    if not made.text:
        summary_release(claim=claim)
        return None
    tokens = spec.tokenizer.count(made.text)
    if not summary_complete(claim=claim, text=made.text, tokens=tokens):
        return None
    return Compacted(made.text, len(turns))


def _permitted(caller: Caller, spec: ModelSpec) -> bool:
    """A caller kept off the summariser's alias by its allow-list gets no summary."""
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key, tag=caller.tag)
    permitted = models_permitted(limits=limits)
    return permitted is None or spec.alias in permitted


def _summarise(
    caller: Caller,
    conversation: Conversation,
    spec: ModelSpec,
    turns: Sequence[ChatMessage],
    previous: Summary | None,
) -> Generated:
    """``turns`` summarised (those after ``previous``, with it), held, made and charged."""
    max_tokens = min(settings.SUMMARY_MAX_TOKENS, spec.max_output_tokens)
    prompt = summary_prompt(
        tokenizer=spec.tokenizer,
        turns=turns[previous.covered :] if previous is not None else turns,
        previous=previous.text if previous is not None else "",
        context_window=spec.context_window,
        max_output_tokens=max_tokens,
    )
    cost = worst_cost(spec, prompt=prompt.prompt_tokens, output=max_tokens)
    reservation = _reserve(caller, tokens=prompt.prompt_tokens + max_tokens, cost=cost)
    try:
        made = async_to_sync(summary_generate)(
            team=caller.team,
            conversation_id=conversation.pk,
            spec=spec,
            prompt=prompt,
            max_tokens=max_tokens,
        )
    except BaseException:
        if reservation is not None:
            budget_settle(reservation=reservation, actual=0)
        raise
    _charge(caller, conversation, spec, made, reservation)
    return made


def _reserve(caller: Caller, *, tokens: int, cost: Decimal) -> Reservation | None:
    """``tokens`` costing at most ``cost`` held against every limit of the caller (429
    here), or None: no limits."""
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key, tag=caller.tag)
    if not limits:
        return None
    return budget_reserve(
        team=caller.team, api_key=caller.api_key, tokens=tokens, cost=cost, limits=limits
    )


def _charge(
    caller: Caller,
    conversation: Conversation,
    spec: ModelSpec,
    made: Generated,
    reservation: Reservation | None,
) -> None:
    """The hold settled at what the summary used, and its ledger row, together."""
    usage = made.usage
    with transaction.atomic():
        if reservation is not None:
            cost = usage_cost(model=made.served.alias, usage=usage, price=made.served.price)
            budget_settle(reservation=reservation, actual=usage.total_tokens, cost=cost)
        usage_record_chat(
            team=caller.team,
            api_key=caller.api_key,
            user=caller.user,
            model=made.served.alias,
            requested_model=spec.alias,
            upstream=made.upstream,
            price=made.served.price,
            energy=made.served.energy,
            usage=usage,
            status=UsageRecord.Status.OK,
            object_id=f"conversation:{conversation.pk}",
            tag=caller.tag,
            operation="summary",
        )


def left_out_tokens(
    tokenizer: Tokenizer,
    *,
    passages: Sequence[SearchResult],
    first: int,
    turns: Sequence[ChatMessage],
) -> int:
    """The tokens the passages and history turns left out (or summarised) would have
    taken, each counted once on its own with the serving model's ``tokenizer`` (escaped as
    the prompt carries it; not the chat template's few tokens around each message).
    ``passages`` are numbered from ``first`` as the prompt would have numbered them."""
    total = sum(_count(tokenizer, turn["content"]) for turn in turns)
    for number, result in enumerate(passages, start=first):
        chunk = result.chunk
        passage = Passage(chunk.document.title, chunk.text, tuple(chunk.headings))
        total += _count(tokenizer, render_passage(number, passage))
    return total


def _count(tokenizer: Tokenizer, text: str) -> int:
    return tokenizer.count(tokenizer.escape(text)) if text else 0
