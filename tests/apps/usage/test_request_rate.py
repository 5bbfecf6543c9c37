"""Requests per team: one team bursting past its request bucket gets 429 ``rate_limited``
with an exact ``Retry-After`` on every authenticated surface, before any work, while
another team's requests pass; in process and in Redis (shared by every process).

Served by the real ASGI app (async answer views on the loop, sync views in threads), with
the buckets' clock held still so that every refill is exact."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError
from django.test import Client

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create, membership_add
from apps.chat.models import Conversation, Message
from apps.core.models import AuditEvent
from apps.knowledge.models import Document
from apps.usage import request_rate
from apps.usage.models import Limit
from tests import factories
from tests.conftest import free_port
from tests.fake_upstream import ServerThread

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
CSRF = "k" * 32  # a CSRF secret, as the page's cookie and header carry it


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    held = Clock()
    monkeypatch.setattr(request_rate, "clock", held)
    return held


@pytest.fixture
def server(transactional_db: None) -> Iterator[str]:
    from config.asgi import application

    with ServerThread(application) as url:
        yield url


@pytest.fixture
def client_of(server: str) -> Iterator[Callable[..., httpx.Client]]:
    """An HTTP client of the served app with a key's secret, or a signed-in session."""
    opened: list[httpx.Client] = []

    def make(*, secret: str | None = None, session: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        cookies = {}
        if session:  # the page's calls: its session cookie, and the CSRF token it sends
            cookies = {django_settings.SESSION_COOKIE_NAME: session, "csrftoken": CSRF}
            headers = {"X-CSRFToken": CSRF}
        client = httpx.Client(base_url=server, headers=headers, cookies=cookies, timeout=30)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


def assert_refused(
    response: httpx.Response, *, retry_after: int, burst: int, what: str = ""
) -> None:
    """429 rate_limited, with exactly this Retry-After and the request headers."""
    assert response.status_code == 429, (what, response.status_code, response.text)
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limited"), what
    assert response.headers["Retry-After"] == str(retry_after), what
    assert response.headers["x-ratelimit-limit-requests"] == str(burst), what
    assert response.headers["x-ratelimit-remaining-requests"] == "0", what
    assert response.headers["x-ratelimit-reset-requests"] == f"{retry_after}s", what


def test_a_team_past_its_burst_waits_exactly_while_another_team_passes(
    limiter_store: str,
    clock: Clock,
    team: Team,
    other_team: Team,
    client_of: Callable[..., httpx.Client],
) -> None:
    Limit.objects.create(team=team, requests_per_second=2, request_burst=3)
    a = client_of(secret=api_key_create(team=team).secret)
    b = client_of(secret=api_key_create(team=other_team).secret)

    assert [a.get("/api/v1/collections").status_code for _ in range(3)] == [200] * 3
    assert_refused(a.get("/api/v1/collections"), retry_after=1, burst=3)
    # Team B has its own bucket (the default: 100 at once).
    assert [b.get("/api/v1/collections").status_code for _ in range(10)] == [200] * 10

    clock.at(0.499)  # one request is earned every 0.5 s: not yet
    assert_refused(a.get("/api/v1/collections"), retry_after=1, burst=3)
    clock.at(0.5)
    assert a.get("/api/v1/collections").status_code == 200
    assert a.get("/api/v1/collections").status_code == 429
    clock.at(1.5)  # two more earned, never more than were due
    assert [a.get("/api/v1/collections").status_code for _ in range(3)] == [200, 200, 429]


def test_the_retry_after_is_exact_and_tokenize_has_its_own_bucket(
    limiter_store: str,
    clock: Clock,
    team: Team,
    other_team: Team,
    client_of: Callable[..., httpx.Client],
    settings: Any,
) -> None:
    """/tokenize's rate (``DEFAULT_THROTTLE_RATES``) is a second bucket of the same kind:
    6 a minute is one every 10 s, so a refusal says how much of those 10 s is left."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"tokenize": "6/minute"},
    }
    a = client_of(secret=api_key_create(team=team).secret)
    b = client_of(secret=api_key_create(team=other_team).secret)

    def tokenize(client: httpx.Client) -> httpx.Response:
        return client.post("/api/v1/tokenize", json={"text": "hello"})

    assert [tokenize(a).status_code for _ in range(6)] == [200] * 6
    assert_refused(tokenize(a), retry_after=10, burst=6)
    clock.at(3.5)
    assert_refused(tokenize(a), retry_after=7, burst=6)
    assert a.get("/api/v1/collections").status_code == 200  # the team's bucket has room
    assert tokenize(b).status_code == 200
    clock.at(10)
    assert tokenize(a).status_code == 200
    assert_refused(tokenize(a), retry_after=10, burst=6)


def test_every_authenticated_surface_is_limited_before_any_work(
    limiter_store: str,
    clock: Clock,
    team: Team,
    other_team: Team,
    issued_key: IssuedKey,
    client_of: Callable[..., httpx.Client],
    upstream: Any,
    django_user_model: Any,
) -> None:
    """Search, listings, uploads, replays, answers and /v1, by key or by the page's
    session: once team A's bucket is empty each is refused and does nothing, while team B
    searches, uploads and is answered."""
    Limit.objects.create(team=team, requests_per_second=1, request_burst=1)
    collection = factories.collection(team=team)
    conversation = Conversation.objects.create(team=team)
    answer = Message.objects.create(
        conversation=conversation,
        team=team,
        role=Message.Role.ASSISTANT,
        status=Message.Status.COMPLETE,
    )
    user = django_user_model.objects.create_user("ann", password="long-password-1")
    membership_add(team=team, user=user)
    browser = Client()
    browser.force_login(user)
    a = client_of(secret=issued_key.secret)
    page = client_of(session=browser.cookies[django_settings.SESSION_COOKIE_NAME].value)
    b = client_of(secret=api_key_create(team=other_team).secret)
    b_collection = factories.collection(team=other_team)

    assert a.get("/api/v1/collections").status_code == 200  # the one request in the bucket
    upload = {"file": ("notes.txt", b"Team A's notes.", "text/plain")}
    chat = {"model": "small", "messages": [{"role": "user", "content": "Hello?"}]}
    attempts = {
        "search": lambda c: c.post("/api/v1/search", json={"query": "notes", "mode": "keyword"}),
        "listing": lambda c: c.get("/api/v1/conversations"),
        "upload": lambda c: c.post(f"/api/v1/collections/{collection.pk}/documents", files=upload),
        "replay": lambda c: c.get(f"/api/v1/messages/{answer.pk}/events"),
        "answer": lambda c: c.post(
            f"/api/v1/conversations/{conversation.pk}/messages",
            json={"content": "Hello?", "top_k": 0},
        ),
        "v1 models": lambda c: c.get("/v1/models"),
        "v1 answer": lambda c: c.post("/v1/chat/completions", json=chat),
        "usage": lambda c: c.get("/api/v1/usage"),
    }
    for name, attempt in attempts.items():
        assert_refused(attempt(a), retry_after=1, burst=1, what=name)
    for name in ("listing", "search", "replay", "answer"):
        assert_refused(attempts[name](page), retry_after=1, burst=1, what=f"page {name}")
    assert not Document.objects.filter(team=team).exists()
    assert list(Message.objects.filter(team=team)) == [answer]
    assert upstream.requests == []

    assert b.post("/api/v1/search", json={"query": "notes", "mode": "keyword"}).status_code == 200
    uploaded = b.post(f"/api/v1/collections/{b_collection.pk}/documents", files=upload)
    assert uploaded.status_code == 202, uploaded.text
    answered = b.post("/v1/chat/completions", json=chat)
    assert answered.status_code == 200, answered.text
    assert len(upstream.requests) == 1

    clock.at(1)
    assert a.get("/api/v1/conversations").status_code == 200


def test_a_team_with_a_rate_of_zero_is_not_limited(
    clock: Clock, team: Team, client_of: Callable[..., httpx.Client]
) -> None:
    Limit.objects.create(team=team, requests_per_second=0, request_burst=1)
    a = client_of(secret=api_key_create(team=team).secret)
    assert [a.get("/api/v1/collections").status_code for _ in range(5)] == [200] * 5


@pytest.mark.parametrize("fallback", ["closed", "database"])
def test_redis_down_limits_requests_in_the_process(
    fallback: str,
    clock: Clock,
    team: Team,
    client_of: Callable[..., httpx.Client],
    settings: Any,
) -> None:
    """Requests cost no tokens: with Redis down, whatever the token limiters' fallback,
    each process limits them on its own buckets rather than refusing every request."""
    settings.RATE_LIMIT_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    settings.RATE_LIMIT_REDIS_TIMEOUT = 0.2
    settings.RATE_LIMIT_REDIS_FALLBACK = fallback
    Limit.objects.create(team=team, requests_per_second=1, request_burst=2)
    a = client_of(secret=api_key_create(team=team).secret)
    first = a.get("/api/v1/collections")
    assert first.status_code == 200, first.text
    # This process's buckets enforce the limit meanwhile, on the sync and async views.
    assert a.post("/v1/chat/completions", json={}).status_code == 400  # admitted, then invalid
    assert_refused(a.get("/api/v1/collections"), retry_after=1, burst=2)


def test_two_processes_share_one_bucket_in_redis(
    asgi_workers: Callable[..., list[str]], team: Team, other_team: Team
) -> None:
    """Two uvicorn processes, one Redis: /tokenize at 4 an hour admits 4 between them."""
    from tests.conftest import reachable_redis_url

    urls = asgi_workers(
        count=2,
        RATE_LIMIT_REDIS_URL=reachable_redis_url(),
        RATE_LIMIT_KEY_PREFIX=django_settings.RATE_LIMIT_KEY_PREFIX,
        TOKENIZE_RATE="4/hour",
    )
    a = {"Authorization": f"Bearer {api_key_create(team=team).secret}"}
    b = {"Authorization": f"Bearer {api_key_create(team=other_team).secret}"}
    statuses = []
    for n in range(8):
        response = httpx.post(f"{urls[n % 2]}/api/v1/tokenize", json={"text": "hi"}, headers=a)
        statuses.append(response.status_code)
        if response.status_code == 429:
            # 4 an hour is one every 900 s: the first refusal comes within seconds of it.
            assert 890 <= int(response.headers["Retry-After"]) <= 900
    assert statuses == [200] * 4 + [429] * 4
    for url in urls:
        assert httpx.post(f"{url}/api/v1/tokenize", json={"text": "hi"}, headers=b).is_success


def test_setlimits_and_the_model_keep_request_rates_on_the_team(team: Team) -> None:
    out = StringIO()
    call_command(
        "setlimits",
        "--team",
        team.name,
        "--requests-per-second",
        "5",
        "--request-burst",
        "40",
        stdout=out,
    )
    limit = Limit.objects.get(team=team, api_key__isnull=True)
    assert (limit.requests_per_second, limit.request_burst) == (5, 40)
    assert "requests_per_second = 5" in out.getvalue()
    call_command("setlimits", "--team", team.name, "--request-burst", "none", stdout=out)
    limit.refresh_from_db()
    assert limit.request_burst is None
    shown = StringIO()
    call_command("setlimits", "--team", team.name, stdout=shown)
    assert "request_burst = default (100)" in shown.getvalue()

    key = api_key_create(team=team).api_key
    with pytest.raises(CommandError, match="request rates are the team's"):
        call_command(
            "setlimits", "--team", team.name, "--key", key.prefix, "--requests-per-second", "1"
        )
    with pytest.raises(IntegrityError):
        Limit.objects.create(team=team, api_key=key, requests_per_second=1)


def test_the_admin_sets_a_team_request_rate_and_refuses_one_on_a_key(
    team: Team, admin_client: Any, issued_key: IssuedKey
) -> None:
    form = {"team": team.pk, "requests_per_second": "3", "request_burst": "9"}
    assert admin_client.post("/admin/usage/limit/add/", form).status_code == 302
    limit = Limit.objects.get()
    assert (limit.requests_per_second, limit.request_burst) == (3, 9)
    change = AuditEvent.objects.get(action=AuditEvent.Action.LIMIT_CREATED)
    assert change.detail["after"]["requests_per_second"] == 3
    on_key = {**form, "api_key": issued_key.api_key.pk}
    refused = admin_client.post("/admin/usage/limit/add/", on_key)
    assert refused.status_code == 200
    assert "Request rates are the team&#x27;s" in refused.content.decode()
    assert (
        admin_client.post("/admin/usage/limit/add/", {**form, "request_burst": "0"}).status_code
        == 200
    )
    assert Limit.objects.count() == 1
