"""The response cache: exact-match answers to single-turn questions, replayed without
calling the tier, team-scoped and encrypted at rest.

:mod:`.answers` says what is kept and under which key; :mod:`.store` picks the store
(:mod:`.redis` when ``RESPONSE_CACHE_REDIS_URL`` is set, else :mod:`.database`). An entry
lives ``RESPONSE_CACHE_TTL`` seconds, never longer than the team's ``retention_days``
(:func:`~.base.response_cache_ttl`), and is purged with the team's data:
:func:`~.store.response_cache_purge` on deletes and by the retention job, so no cached
answer stays readable past what the team keeps.
"""

from apps.chat.response_cache.answers import (
    CachedAnswer,
    cached_answer_events,
    cached_answer_get,
    cached_answer_put,
    question_normalize,
    response_cache_key,
)
from apps.chat.response_cache.base import ResponseCache, response_cache_ttl
from apps.chat.response_cache.store import (
    response_cache,
    response_cache_expire,
    response_cache_purge,
)

__all__ = [
    "CachedAnswer",
    "ResponseCache",
    "cached_answer_events",
    "cached_answer_get",
    "cached_answer_put",
    "question_normalize",
    "response_cache",
    "response_cache_expire",
    "response_cache_key",
    "response_cache_purge",
    "response_cache_ttl",
]
