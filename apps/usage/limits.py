"""The limits that apply to a caller, read from the database or from a short cache."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from decimal import Decimal
from time import monotonic

from django.conf import settings
from django.db.models import Q, QuerySet, signals

from apps.accounts.models import ApiKey, Team
from apps.usage.limiters import TOKENS, USD
from apps.usage.models import Limit
from apps.usage.values import nanos_of


def limits_of(*, team: Team, api_key: ApiKey | None, tag: str = "") -> QuerySet[Limit]:
    """The limits that apply to a caller: the team's, the key's when there is one, and
    the team's limit of the purpose tag its request is charged under when there is one."""
    scopes = Q(team=team, api_key__isnull=True, tag="")
    if api_key is not None:
        scopes |= Q(api_key=api_key)
    if tag:
        scopes |= Q(team=team, tag=tag)
    return Limit.objects.filter(scopes)


def limit_periods(limit: Limit) -> list[tuple[str, str, int]]:
    """A limit's period quotas as (period, unit, maximum): its token quotas, and its
    money budgets in nano-dollars."""
    found = [
        (period, TOKENS, int(maximum))
        for period, maximum in (("day", limit.daily_tokens), ("month", limit.monthly_tokens))
        if maximum is not None
    ]
    found += [
        (period, USD, nanos_of(Decimal(maximum)))
        for period, maximum in (("day", limit.daily_usd), ("month", limit.monthly_usd))
        if maximum is not None
    ]
    return found


class LimitsCache:
    """The limits of each caller (team, key) as read in the last ``LIMITS_CACHE_SECONDS``
    (5 by default; 0 turns it off), so that an answer reads none before its first token.
    A limit saved or deleted in this process applies at once (the cache is cleared); one
    changed in another process, within the cache time, like a key's revocation. Bounded:
    past ``max_entries`` callers it starts afresh."""

    def __init__(
        self, *, max_entries: int = 10_000, clock: Callable[[], float] = monotonic
    ) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[tuple[int, int | None, str], tuple[float, list[Limit]]] = {}
        self._lock = threading.Lock()

    def get(self, *, team: Team, api_key: ApiKey | None, tag: str = "") -> list[Limit]:
        ttl: float = settings.LIMITS_CACHE_SECONDS
        key = (team.pk, api_key.pk if api_key is not None else None, tag)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is not None and now - entry[0] < ttl:
            return entry[1]
        limits = list(limits_of(team=team, api_key=api_key, tag=tag))
        if ttl > 0:
            with self._lock:
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
                self._entries[key] = (now, limits)
        return limits

    def clear(self, **_: object) -> None:
        with self._lock:
            self._entries.clear()


limits_cache = LimitsCache()
signals.post_save.connect(limits_cache.clear, sender=Limit, weak=False)
signals.post_delete.connect(limits_cache.clear, sender=Limit, weak=False)


def models_permitted(*, limits: Iterable[Limit]) -> frozenset[str] | None:
    """The aliases a caller may use: those every one of its limits with a list allows
    (the team's and its key's); None when none has a list."""
    lists = [
        frozenset(limit.allowed_models) for limit in limits if limit.allowed_models is not None
    ]
    return frozenset.intersection(*lists) if lists else None


def max_tokens_cap(*, limits: Iterable[Limit]) -> int | None:
    """The tightest ``max_tokens`` cap of a caller's limits; None when there is none."""
    known = [int(limit.max_tokens) for limit in limits if limit.max_tokens is not None]
    return min(known) if known else None


def aliases_unknown(names: Iterable[str]) -> list[str]:
    """Those of ``names`` that are no model alias of this deployment, sorted."""
    return sorted(set(names) - set(model_aliases()))


def model_aliases() -> list[str]:
    """The model aliases a limit's allow-list may name."""
    return sorted(settings.INFERENCE_MODELS or settings.MODEL_ALIASES)
