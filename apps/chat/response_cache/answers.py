"""What the response cache keeps: a single-turn question's answer, under a key naming
everything the answer depends on, replayed without calling the tier.

The key (:func:`response_cache_key`) is a SHA-256 of everything the answer depends on:
the team, the index version of every collection searched (an ingest or a delete moves it,
so older entries miss), the question normalized (Unicode case-folded, runs of whitespace
made one space, ends stripped), the alias that serves, ``max_tokens``, the sampling
parameters, the client's instructions and the search (mode, filters, ``top_k``); not
whether reasoning is streamed, since the entry keeps the reasoning and each request shows
it or not (the OpenAI surface always does, the native one on request), so both surfaces
share an entry. What is stored is the answer's events (citations, deltas, finish
reason), in the store the settings choose (:mod:`.store`: Redis or the database,
encrypted at rest).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.accounts.models import Team
from apps.chat.response_cache.base import response_cache_ttl
from apps.chat.response_cache.store import response_cache
from apps.core.crypto import InvalidToken
from apps.knowledge.selectors import collection_list_readable
from apps.knowledge.services import SearchFilters
from apps.usage import metrics
from inference import Event, Finished, ReasoningDelta, TextDelta

if TYPE_CHECKING:  # services import this module
    from apps.chat.services.types import Citation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedAnswer:
    """What a hit replays: the ``retrieval`` event's citations, the ``delta`` (and
    ``reasoning``) texts as they were streamed, and how the answer finished."""

    citations: list[Citation]
    text: list[str]
    reasoning: list[str] = field(default_factory=list)
    finish_reason: str = "stop"

    def dumps(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def loads(cls, payload: str) -> CachedAnswer:
        return cls(**json.loads(payload))


def question_normalize(question: str) -> str:
    """Case-folded (Unicode ``casefold``), whitespace runs as one space, ends stripped."""
    return " ".join(question.split()).casefold()


def response_cache_key(
    *,
    team: Team,
    question: str,
    alias: str,
    max_tokens: int,
    collection_ids: list[int] | None,
    search: Mapping[str, Any],
    sampling: Mapping[str, Any],
    instructions: str = "",
) -> str:
    """The digest naming one answer. ``collection_ids``: those searched (None: every
    collection of the team; an empty list: none, RAG off); their index versions are read
    here, before the search, so an ingest landing meanwhile makes this entry miss later
    rather than serve an older index under a newer version."""
    versions = (
        []
        if collection_ids == []
        else [
            [collection.pk, collection.index_version]
            for collection in collection_list_readable(team=team, ids=collection_ids)
        ]
    )
    material = {
        "team": team.pk,
        "question": question_normalize(question),
        "alias": alias,
        "max_tokens": max_tokens,
        "index_versions": sorted(versions),
        "search": dict(search),
        "sampling": dict(sampling),
        "instructions": instructions,
    }
    encoded = json.dumps(material, sort_keys=True, ensure_ascii=False, default=_plain)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def _plain(value: object) -> object:
    if isinstance(value, SearchFilters):
        return asdict(value)
    raise TypeError(f"cannot key a {type(value).__name__}")


async def cached_answer_get(*, team: Team, key: str) -> CachedAnswer | None:
    """The stored answer, or None. A store that fails is a miss: the tier answers."""
    answer = None
    try:
        payload = await response_cache().get(team_id=team.pk, key=key)
        answer = CachedAnswer.loads(payload) if payload is not None else None
    except (RedisError, DatabaseError, TimeoutError, InvalidToken, ValueError, TypeError) as exc:
        # Also an entry under a key rotated away, or of another shape: it expires.
        logger.warning("response cache unreadable, answering afresh: %r", exc)
    metrics.RESPONSE_CACHE.labels("hit" if answer is not None else "miss").inc()
    return answer


async def cached_answer_put(*, team: Team, key: str, answer: CachedAnswer) -> None:
    """Keep ``answer`` for the team's TTL. A store that fails loses only the entry."""
    ttl = response_cache_ttl(team=team)
    if ttl <= 0:
        return
    try:
        await response_cache().put(team_id=team.pk, key=key, payload=answer.dumps(), ttl=ttl)
    except (RedisError, DatabaseError, TimeoutError) as exc:
        logger.warning("response cache not written: %r", exc)


async def cached_answer_events(cached: CachedAnswer) -> AsyncIterator[Event]:
    """A cached answer as the tier's events: its reasoning, its deltas, how it finished."""
    for text in cached.reasoning:
        yield ReasoningDelta(text)
    for text in cached.text:
        yield TextDelta(text)
    yield Finished(cached.finish_reason)
