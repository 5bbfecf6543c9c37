"""Login throttling (django-axes): by username and IP together and by IP alone, unknown
usernames counted, 429."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import AsyncClient, Client
from django.utils import timezone

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
LIMIT = 5


@pytest.fixture(autouse=True)
def _limits(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    settings.AXES_RESET_ON_SUCCESS = True


@pytest.fixture
def alice(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user(username="alice", password=PASSWORD)


@pytest.fixture
def mallory(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user(username="mallory", password=PASSWORD)


def login(username: str, password: str, *, ip: str = "203.0.113.1", path: str = "/login") -> Any:
    return Client().post(path, {"username": username, "password": password}, REMOTE_ADDR=ip)


def assert_locked(response: Any) -> None:
    assert response.status_code == 429, response.status_code
    assert response.json()["error"] == {
        "type": "rate_limit_error",
        "code": "too_many_login_attempts",
        "message": "Too many failed logins for this account or address; try again later.",
        "param": None,
    }
    assert response["Retry-After"] == str(15 * 60)


def test_five_bad_passwords_lock_the_account_even_for_the_right_one(alice: User) -> None:
    for _ in range(LIMIT - 1):
        assert login("alice", "wrong").status_code == 200  # the form again, with its error
    assert_locked(login("alice", "wrong"))
    assert_locked(login("alice", PASSWORD))


def test_bad_passwords_from_one_address_never_lock_the_account_elsewhere(alice: User) -> None:
    """Issue 27, item 10: locked by username alone, anyone could lock ``alice`` (or
    ``admin``) out for everyone with five bad passwords."""
    for _ in range(LIMIT):
        login("alice", "wrong", ip="198.51.100.66")
    assert_locked(login("alice", PASSWORD, ip="198.51.100.66"))  # the guesser's address
    assert login("alice", PASSWORD, ip="192.0.2.77").status_code == 302


def test_the_address_is_locked_for_every_username(alice: User) -> None:
    """Spraying one password over many usernames, known or not, counts per IP."""
    for n in range(LIMIT):
        login(f"user{n}", "wrong", ip="203.0.113.9")
    assert_locked(login("alice", PASSWORD, ip="203.0.113.9"))
    assert login("alice", PASSWORD, ip="203.0.113.10").status_code == 302


def test_unknown_usernames_are_counted(db: None) -> None:
    for _ in range(LIMIT - 1):
        assert login("nobody", "wrong").status_code == 200
    assert_locked(login("nobody", "wrong"))
    attempt = AccessAttempt.objects.get(username="nobody")
    assert attempt.failures_since_start == LIMIT


def test_a_success_clears_the_account_failures(alice: User) -> None:
    for _ in range(LIMIT - 1):
        login("alice", "wrong")
    assert login("alice", PASSWORD).status_code == 302
    assert not AccessAttempt.objects.filter(username="alice").exists()
    for _ in range(LIMIT - 1):
        assert login("alice", "wrong").status_code == 200
    assert login("alice", PASSWORD).status_code == 302


def test_without_reset_on_success_the_failures_stand(alice: User, settings: Any) -> None:
    settings.AXES_RESET_ON_SUCCESS = False
    for _ in range(LIMIT - 1):
        login("alice", "wrong")
    assert login("alice", PASSWORD).status_code == 302
    assert_locked(login("alice", "wrong"))


def test_logging_in_to_ones_own_account_clears_nothing_else(alice: User, mallory: User) -> None:
    """Axes' own reset would clear every failure from the address: four guesses at
    alice, a login as mallory, and four more, for ever."""
    for _ in range(LIMIT - 1):
        login("alice", "wrong", ip="203.0.113.66")
    assert login("mallory", PASSWORD, ip="203.0.113.66").status_code == 302
    assert_locked(login("alice", "wrong", ip="203.0.113.66"))
    assert_locked(login("alice", PASSWORD, ip="203.0.113.66"))
    assert login("alice", PASSWORD, ip="192.0.2.1").status_code == 302  # her own address


def test_the_lock_lifts_after_the_cool_off(alice: User) -> None:
    for _ in range(LIMIT):
        login("alice", "wrong")
    assert_locked(login("alice", PASSWORD))
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert login("alice", PASSWORD).status_code == 302


def test_admin_login_is_throttled_too(django_user_model: type[User]) -> None:
    django_user_model.objects.create_superuser(username="root", password=PASSWORD)
    for _ in range(LIMIT - 1):
        assert login("root", "wrong", path="/admin/login/").status_code == 200
    assert_locked(login("root", "wrong", path="/admin/login/"))
    assert_locked(login("root", PASSWORD, path="/admin/login/"))


@pytest.mark.django_db(transaction=True)
async def test_lockout_through_the_asgi_handler(django_user_model: type[User]) -> None:
    """Under ASGI the middleware takes its async path (another call to the lockout
    response); the answer is the same."""
    from asgiref.sync import sync_to_async

    await sync_to_async(django_user_model.objects.create_user)(username="bob", password=PASSWORD)
    client = AsyncClient()
    for _ in range(LIMIT - 1):
        response = await client.post("/login", {"username": "bob", "password": "wrong"})
        assert response.status_code == 200
    assert_locked(await client.post("/login", {"username": "bob", "password": "wrong"}))
    assert_locked(await client.post("/login", {"username": "bob", "password": PASSWORD}))
