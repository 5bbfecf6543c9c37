"""API keys are authenticated from an in-process cache: no query per request, and a
revocation, deletion or scope change made elsewhere is seen within ``API_KEY_CACHE_SECONDS``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from apps.accounts.authentication import ApiKeyAuthentication
from apps.accounts.models import ApiKey, Team
from apps.accounts.selectors import ApiKeyCache, api_key_cache, caller_for
from apps.accounts.services import (
    IssuedKey,
    api_key_create,
    api_key_revoke,
    api_key_touch,
    membership_add,
)

pytestmark = pytest.mark.django_db


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[FakeClock]:
    """The process's key cache, empty, with a 5 s TTL, on a clock the test moves."""
    settings.API_KEY_CACHE_SECONDS = 5
    fake = FakeClock()
    cache = api_key_cache()
    cache.clear()
    monkeypatch.setattr(cache, "clock", fake)
    yield fake
    cache.clear()


def authenticate(secret: str) -> tuple[Any, ApiKey]:
    request = Request(APIRequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {secret}"))
    result = ApiKeyAuthentication().authenticate(request)
    assert result is not None
    return result


def refusal_code(secret: str) -> object:
    with pytest.raises(exceptions.AuthenticationFailed) as refused:
        authenticate(secret)
    return refused.value.get_codes()


def test_a_cached_key_costs_no_query(
    clock: FakeClock, team: Team, django_user_model: Any, django_assert_num_queries: Any
) -> None:
    user = django_user_model.objects.create_user("ann", password="pw-long-enough")
    membership_add(team=team, user=user)
    issued = api_key_create(team=team, scopes=["read"], user=user)
    with django_assert_num_queries(2):  # the lookup, and last_used_at
        authenticate(issued.secret)
    clock.now += 4
    with django_assert_num_queries(0):
        authenticated_user, api_key = authenticate(issued.secret)
        caller = caller_for(user=authenticated_user, api_key=api_key)
        assert caller is not None
        assert (caller.team.name, caller.user, caller.scopes) == ("acme", user, frozenset({"read"}))


def test_a_key_without_a_user_costs_no_query_either(
    clock: FakeClock, issued_key: IssuedKey, django_assert_num_queries: Any
) -> None:
    authenticate(issued_key.secret)
    with django_assert_num_queries(0):
        user, api_key = authenticate(issued_key.secret)
        assert api_key.user is None and not user.is_authenticated
        assert api_key.team.name == "acme"


def test_a_revocation_elsewhere_takes_effect_within_the_ttl(
    clock: FakeClock, issued_key: IssuedKey
) -> None:
    authenticate(issued_key.secret)
    # Another process revokes it: this one's cache does not hear of it.
    ApiKey.objects.filter(pk=issued_key.api_key.pk).update(revoked_at=timezone.now())
    clock.now += 4.9
    authenticate(issued_key.secret)
    clock.now += 0.1
    assert refusal_code(issued_key.secret) == "revoked_api_key"


def test_a_revocation_in_this_process_takes_effect_at_once(
    clock: FakeClock, issued_key: IssuedKey
) -> None:
    authenticate(issued_key.secret)
    api_key_revoke(api_key=ApiKey.objects.get(pk=issued_key.api_key.pk))
    assert refusal_code(issued_key.secret) == "revoked_api_key"


def test_deletion_and_new_scopes_take_effect_within_the_ttl(clock: FakeClock, team: Team) -> None:
    deleted = api_key_create(team=team, scopes=["read"])
    narrowed = api_key_create(team=team, scopes=["read", "chat"])
    authenticate(deleted.secret)
    authenticate(narrowed.secret)
    ApiKey.objects.filter(pk=deleted.api_key.pk).delete()
    ApiKey.objects.filter(pk=narrowed.api_key.pk).update(scopes=["read"])
    clock.now += 5
    assert refusal_code(deleted.secret) == "invalid_api_key"
    _, api_key = authenticate(narrowed.secret)
    caller = caller_for(user=None, api_key=api_key)
    assert caller is not None and caller.scopes == {"read"}


def test_a_wrong_secret_for_a_cached_prefix_is_refused(
    clock: FakeClock, issued_key: IssuedKey, django_assert_num_queries: Any
) -> None:
    authenticate(issued_key.secret)
    with django_assert_num_queries(0):
        assert refusal_code(issued_key.secret[:-4] + "AAAA") == "invalid_api_key"
        assert refusal_code(issued_key.secret + "A") == "invalid_api_key"
    authenticate(issued_key.secret)


def test_unknown_prefixes_are_remembered_briefly_apart_from_keys(
    clock: FakeClock, issued_key: IssuedKey, django_assert_num_queries: Any
) -> None:
    for n in range(3):
        with django_assert_num_queries(1):
            assert refusal_code(f"rt_unknown{n}_secret") == "invalid_api_key"
        with django_assert_num_queries(0):  # a repeated made-up key costs no query
            assert refusal_code(f"rt_unknown{n}_secret") == "invalid_api_key"
    assert len(api_key_cache()) == 0  # and pushes no real key out
    clock.now += 5
    with django_assert_num_queries(1):
        assert refusal_code("rt_unknown0_secret") == "invalid_api_key"


def test_a_key_made_after_its_prefix_missed_is_found_once_forgotten(
    clock: FakeClock, team: Team, django_assert_num_queries: Any
) -> None:
    cache = api_key_cache()
    assert cache.get(prefix="abc123") is None
    issued = api_key_create(team=team, scopes=["read"])
    ApiKey.objects.filter(pk=issued.api_key.pk).update(prefix="abc123")
    assert cache.get(prefix="abc123") is None  # the miss, for API_KEY_CACHE_SECONDS
    cache.forget(prefix="abc123")
    found = cache.get(prefix="abc123")
    assert found is not None and found.pk == issued.api_key.pk


def test_the_least_recently_used_key_is_dropped_past_max_entries(
    clock: FakeClock, team: Team, django_assert_num_queries: Any
) -> None:
    cache = ApiKeyCache(max_entries=2, clock=FakeClock())
    first, second, third = (api_key_create(team=team).api_key.prefix for _ in range(3))
    cache.get(prefix=first)
    cache.get(prefix=second)
    cache.get(prefix=first)  # now the most recently used
    cache.get(prefix=third)
    assert len(cache) == 2
    with django_assert_num_queries(0):
        cache.get(prefix=first)
        cache.get(prefix=third)
    with django_assert_num_queries(1):
        cache.get(prefix=second)


def test_a_ttl_of_zero_turns_the_cache_off(
    clock: FakeClock, issued_key: IssuedKey, settings: Any, django_assert_num_queries: Any
) -> None:
    settings.API_KEY_CACHE_SECONDS = 0
    authenticate(issued_key.secret)
    with django_assert_num_queries(1):
        authenticate(issued_key.secret)
    assert len(api_key_cache()) == 0


def test_touch_writes_at_most_once_a_minute(
    issued_key: IssuedKey, django_assert_num_queries: Any
) -> None:
    api_key = issued_key.api_key
    start = timezone.now()
    with django_assert_num_queries(1):
        api_key_touch(api_key=api_key, now=start)
    with django_assert_num_queries(0):
        api_key_touch(api_key=api_key, now=start + timedelta(seconds=59))
    with django_assert_num_queries(1):
        api_key_touch(api_key=api_key, now=start + timedelta(minutes=1))
    api_key.refresh_from_db()
    assert api_key.last_used_at == start + timedelta(minutes=1)


def test_steady_traffic_writes_last_used_once_per_cached_load(
    clock: FakeClock, issued_key: IssuedKey, django_assert_num_queries: Any
) -> None:
    authenticate(issued_key.secret)
    first_use = ApiKey.objects.get(pk=issued_key.api_key.pk).last_used_at
    assert first_use is not None
    clock.now += 5  # the entry expires; the reloaded row's last_used_at is recent
    with django_assert_num_queries(1):
        authenticate(issued_key.secret)
    with django_assert_num_queries(0):
        for _ in range(10):
            authenticate(issued_key.secret)
    assert ApiKey.objects.get(pk=issued_key.api_key.pk).last_used_at == first_use
