"""Query-side accounting: a search's query embedding is held against the team's quota
before anything is embedded, and settled to its exact count; counting text is throttled."""

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.knowledge.services import embedder
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from tests.apps.accounts.test_auth import error_of

pytestmark = pytest.mark.django_db(transaction=True)

QUERY = {"query": "how are API keys stored?", "top_k": 3}


def test_a_search_holds_and_settles_its_query_tokens(api: APIClient, team: Team) -> None:
    Limit.objects.create(team=team, daily_tokens=1_000)
    response = api.post("/api/v1/search", QUERY, format="json")
    assert response.status_code == 200, response.content
    expected = embedder().count_embedding_tokens([QUERY["query"]])
    record = UsageRecord.objects.get(kind=UsageRecord.Kind.EMBEDDING)
    assert record.total_tokens == expected
    assert QuotaCounter.objects.get().used == expected
    assert not Reservation.objects.filter(settled_at__isnull=True).exists()


def test_a_team_past_its_quota_gets_a_429_and_no_compute(
    api: APIClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    Limit.objects.create(team=team, daily_tokens=2)
    embedded: list[Any] = []
    model = embedder()
    monkeypatch.setattr(model, "embed", lambda texts: embedded.append(texts))
    response = api.post("/api/v1/search", QUERY, format="json")
    assert response.status_code == 429
    assert error_of(response)["code"] == "team_quota_exceeded"
    assert embedded == []
    assert not UsageRecord.objects.exists()


def test_tokenize_is_throttled_per_team(api: APIClient, settings: Any) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"tokenize": "3/minute"},
    }
    statuses = [
        api.post("/api/v1/tokenize", {"text": "hello"}, format="json").status_code for _ in range(4)
    ]
    assert statuses == [200, 200, 200, 429]
    refused = api.post("/api/v1/tokenize", {"text": "hello"}, format="json")
    assert error_of(refused)["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
