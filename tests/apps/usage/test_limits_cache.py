"""Each caller's limits are read once per ``LIMITS_CACHE_SECONDS``: a change made in this
process applies at once, one made elsewhere within the cache time."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import Team
from apps.usage.budgets import LimitsCache
from apps.usage.models import Limit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_limits_are_read_once_within_the_cache_time(team: Team, settings: Any) -> None:
    settings.LIMITS_CACHE_SECONDS = 5
    clock = Clock()
    cache = LimitsCache(clock=clock)
    Limit.objects.create(team=team, daily_tokens=100)
    with CaptureQueriesContext(connection) as first:
        assert [limit.daily_tokens for limit in cache.get(team=team, api_key=None)] == [100]
    with CaptureQueriesContext(connection) as again:
        cache.get(team=team, api_key=None)
    assert len(first) == 1 and len(again) == 0

    Limit.objects.filter(team=team).update(daily_tokens=50)  # as another process would
    assert cache.get(team=team, api_key=None)[0].daily_tokens == 100
    clock.now = 5.0
    assert cache.get(team=team, api_key=None)[0].daily_tokens == 50


def test_a_limit_saved_or_deleted_here_applies_at_once(team: Team, settings: Any) -> None:
    from apps.usage.budgets import limits_cache

    settings.LIMITS_CACHE_SECONDS = 60
    assert limits_cache.get(team=team, api_key=None) == []
    limit = Limit.objects.create(team=team, daily_tokens=100)
    assert limits_cache.get(team=team, api_key=None) == [limit]
    limit.delete()
    assert limits_cache.get(team=team, api_key=None) == []


def test_zero_turns_it_off(team: Team, settings: Any) -> None:
    settings.LIMITS_CACHE_SECONDS = 0
    cache = LimitsCache()
    cache.get(team=team, api_key=None)
    with CaptureQueriesContext(connection) as again:
        cache.get(team=team, api_key=None)
    assert len(again) == 1
