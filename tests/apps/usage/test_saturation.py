"""The share of a team's answers that ran near the window limit, and the pages that show
it."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import Membership, Team
from apps.accounts.services import membership_add
from apps.usage.models import UsageRecord
from apps.usage.saturation import context_saturation

pytestmark = pytest.mark.django_db

TODAY = date(2026, 3, 10)
NOON = time(12, tzinfo=UTC)


def answer(
    team: Team,
    *,
    prompt: int,
    window: int | None = 1000,
    day: date = TODAY,
    kind: str = UsageRecord.Kind.CHAT,
    cache_hit: bool = False,
) -> UsageRecord:
    row = UsageRecord.objects.create(
        team=team,
        kind=kind,
        model="small",
        operation="answer",
        prompt_tokens=prompt,
        context_window=window,
        cache_hit=cache_hit,
    )
    at = datetime.combine(day, NOON)
    UsageRecord.objects.filter(pk=row.pk).update(created_at=at)  # auto_now_add otherwise
    return row


def test_the_share_of_answers_at_or_above_the_threshold_per_day_and_in_all(
    team: Team, other_team: Team
) -> None:
    yesterday = TODAY - timedelta(days=1)
    for prompt in (900, 899, 1000, 100):  # fills 0.9 (counts: at the threshold), 0.899…
        answer(team, prompt=prompt)
    answer(team, prompt=9_000_000, window=10_000_000)  # 32-bit products would overflow
    answer(team, prompt=50, window=1000, day=yesterday)
    answer(team, prompt=95, window=100, day=yesterday)
    answer(team, prompt=0, window=1000, cache_hit=True)  # the cache answered: no window
    answer(team, prompt=990, window=None, kind=UsageRecord.Kind.EMBEDDING)
    answer(team, prompt=999, day=TODAY - timedelta(days=40))  # outside the range
    answer(other_team, prompt=1000)  # another team's

    report = context_saturation(
        team=team, start=TODAY - timedelta(days=6), end=TODAY, threshold=0.9
    )

    assert (report.total.answers, report.total.near_limit) == (7, 4)
    assert report.total.share == pytest.approx(4 / 7) and report.total.percent == 57.1
    assert [(d.day, d.answers, d.near_limit) for d in report.daily] == [
        (yesterday, 2, 1),
        (TODAY, 5, 3),
    ]
    strict = context_saturation(team=team, start=TODAY, end=TODAY, threshold=0.95)
    assert (strict.total.answers, strict.total.near_limit) == (5, 1)
    empty = context_saturation(team=other_team, start=yesterday, end=yesterday, threshold=0.9)
    assert (empty.total.answers, empty.total.share, empty.daily) == (0, 0.0, [])


def saturation_of(html: str) -> dict[str, str]:
    match = re.search(r'<div class="usage-saturation" ([^>]*)>', html)
    assert match is not None, "the page shows no saturation"
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', match.group(1)))


def test_the_team_and_admin_pages_show_the_share_of_their_team_only(
    client: Client,
    admin_client: Client,
    team: Team,
    other_team: Team,
    django_user_model: Any,
    settings: Any,
) -> None:
    settings.USAGE_SATURATION_THRESHOLD = 0.8
    today = timezone.now().astimezone(UTC).date()  # the pages' range ends today (UTC here)
    for prompt in (850, 100, 120, 800):
        answer(team, prompt=prompt, day=today)
    answer(other_team, prompt=1000, day=today)
    answer(other_team, prompt=999, day=today)
    member = django_user_model.objects.create_user("member", password="a-long-password-1")
    membership_add(team=team, user=member, role=Membership.Role.MEMBER)
    client.force_login(member)

    html = client.get("/usage").content.decode()
    assert saturation_of(html) == {"answers": "4", "near-limit": "2", "share": "50.0"}
    assert "used at least 80.0% of the model's context window" in html
    assert f'<tr data-saturation-day="{today.isoformat()}">' in html

    admin_page = admin_client.get(reverse("admin:accounts_team_usage", args=[other_team.pk]))
    assert saturation_of(admin_page.content.decode()) == {
        "answers": "2",
        "near-limit": "2",
        "share": "100.0",
    }


def test_the_ledger_admin_lists_where_energy_came_from(admin_client: Client, team: Team) -> None:
    row = answer(team, prompt=10)
    UsageRecord.objects.filter(pk=row.pk).update(energy_source="rapl", energy_wh=0.25)
    page = admin_client.get(reverse("admin:usage_usagerecord_changelist"))
    html = page.content.decode()
    assert '<td class="field-energy_source">rapl</td>' in html
    assert "energy_source=rapl" in html  # the filter
