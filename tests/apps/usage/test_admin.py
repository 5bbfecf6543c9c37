"""The per-team usage page in Django admin, and the selector and chart geometry behind it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create
from apps.usage.charts import ChartPoint, Series, compact, stacked_bar_chart
from apps.usage.models import Limit, QuotaCounter, UsageRecord
from apps.usage.selectors import usage_daily_by_kind

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(autouse=True)
def _database_limiter(settings: Any) -> None:
    """Buckets and slots from the database, whatever REDIS_URL the environment has."""
    settings.RATE_LIMIT_REDIS_URL = ""


def record(
    team: Team,
    kind: str,
    *,
    at: datetime,
    prompt: int,
    completion: int = 0,
    cached: int = 0,
    reasoning: int = 0,
) -> UsageRecord:
    row = UsageRecord.objects.create(
        team=team,
        kind=kind,
        model="small",
        operation="query",
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        reasoning_tokens=reasoning,
    )
    # created_at is auto_now_add: only an update can move it.
    UsageRecord.objects.filter(pk=row.pk).update(created_at=at)
    return row


def usage_url(team_id: int, days: int | str | None = None) -> str:
    url = reverse("admin:accounts_team_usage", args=[team_id])
    return url if days is None else f"{url}?days={days}"


def svg_of(html: str) -> ET.Element:
    match = re.search(r'<svg class="usage-chart".*?</svg>', html, re.DOTALL)
    assert match is not None, "the page has no usage chart"
    return ET.fromstring(match.group(0))  # noqa: S314 (our own template's output)


def bars_of(svg: ET.Element) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if g.get("class") == "bar"]


def segments_of(bar: ET.Element) -> dict[str, ET.Element]:
    return {
        rect.get("data-kind", ""): rect
        for rect in bar.iter(f"{SVG}rect")
        if rect.get("class") == "segment"
    }


def numbers_in_row(html: str, opening: str) -> list[int]:
    match = re.search(re.escape(opening) + r"(.*?)</tr>", html, re.DOTALL)
    assert match is not None, f"no table row {opening}"
    return [int(n) for n in re.findall(r'<t[dh] class="number">(\d+)</t[dh]>', match.group(1))]


def quota_entry(html: str, scope: str) -> str:
    match = re.search(
        rf'<div class="quota-entry" data-scope="{re.escape(scope)}">(.*?)</div>', html, re.DOTALL
    )
    assert match is not None, f"no quota entry for {scope}"
    return match.group(1)


def field(entry: str, name: str) -> str:
    match = re.search(rf"<dt>{re.escape(name)}</dt><dd[^>]*>([^<]*)</dd>", entry)
    assert match is not None, f"no field {name}"
    return match.group(1)


def test_daily_by_kind_counts_days_in_the_team_time_zone_and_keeps_empty_days(
    team: Team, other_team: Team
) -> None:
    team.time_zone = "Asia/Tokyo"
    team.save()
    late_evening = datetime(2026, 5, 1, 14, 30, tzinfo=UTC)  # 23:30 on 1 May in Tokyo
    after_midnight = datetime(2026, 5, 1, 15, 30, tzinfo=UTC)  # 00:30 on 2 May in Tokyo
    record(team, "chat", at=late_evening, prompt=100, cached=40, completion=50, reasoning=20)
    record(team, "embedding", at=after_midnight, prompt=70)
    record(team, "chat", at=datetime(2026, 4, 29, 14, 59, tzinfo=UTC), prompt=1)  # 29 Apr
    record(team, "chat", at=datetime(2026, 5, 2, 15, 0, tzinfo=UTC), prompt=2)  # 3 May 00:00
    record(other_team, "chat", at=late_evening, prompt=999)

    rows = usage_daily_by_kind(team=team, start=date(2026, 4, 30), end=date(2026, 5, 2))

    assert [(row["day"], row["tokens"]) for row in rows] == [
        (date(2026, 4, 30), {"chat": 0, "embedding": 0}),
        # 100 prompt + 50 completion: the cached and reasoning subsets are not added again.
        (date(2026, 5, 1), {"chat": 150, "embedding": 0}),
        (date(2026, 5, 2), {"chat": 0, "embedding": 70}),
    ]
    team.time_zone = "UTC"
    team.save()
    utc_rows = usage_daily_by_kind(team=team, start=date(2026, 5, 1), end=date(2026, 5, 1))
    assert utc_rows[0]["tokens"] == {"chat": 150, "embedding": 70}


def test_usage_page_draws_the_chart_and_table_and_shows_what_remains(
    admin_client: Client, team: Team, other_team: Team, issued_key: IssuedKey
) -> None:
    today = timezone.now().astimezone(UTC).date()
    busy, quiet = today - timedelta(days=2), today - timedelta(days=5)
    noon = time(12, tzinfo=UTC)
    record(
        team,
        "chat",
        at=datetime.combine(busy, noon),
        prompt=1000,
        cached=400,
        completion=200,
        reasoning=150,
    )
    record(team, "embedding", at=datetime.combine(busy, noon), prompt=300)
    record(team, "chat", at=datetime.combine(quiet, noon), prompt=500, completion=100)
    record(team, "embedding", at=datetime.combine(quiet, noon), prompt=200)
    record(team, "chat", at=datetime.combine(today - timedelta(days=40), noon), prompt=7)
    record(other_team, "chat", at=datetime.combine(busy, noon), prompt=99_999)
    limit = Limit.objects.create(team=team, daily_tokens=10_000)
    QuotaCounter.objects.create(limit=limit, period="day", starts_on=today, used=2_500)
    Limit.objects.create(team=team, api_key=issued_key.api_key, daily_tokens=500, max_tokens=256)
    unlimited_key = api_key_create(team=team, name="no limits").api_key

    response = admin_client.get(usage_url(team.pk))

    assert response.status_code == 200
    html = response.content.decode()
    assert "admin/base_site.html" in [t.name for t in response.templates]

    bars = bars_of(svg_of(html))
    assert len(bars) == 30  # one per day, empty days included
    assert [b.get("data-day") for b in bars][-1] == today.isoformat()
    drawn = {b.get("data-day"): segments_of(b) for b in bars if segments_of(b)}
    assert set(drawn) == {busy.isoformat(), quiet.isoformat()}
    busy_bar = next(b for b in bars if b.get("data-day") == busy.isoformat())
    title = busy_bar.find(f"{SVG}title")
    assert title is not None
    assert title.text == f"{busy.isoformat()}: chat 1,200 · embedding 300 · total 1,500 tokens"
    heights = {
        (day, kind): float(rect.get("height", "0"))
        for day, segments in drawn.items()
        for kind, rect in segments.items()
    }
    assert heights[(busy.isoformat(), "chat")] / heights[(busy.isoformat(), "embedding")] == (
        pytest.approx(1200 / 300, rel=1e-3)
    )
    assert heights[(busy.isoformat(), "chat")] / heights[(quiet.isoformat(), "chat")] == (
        pytest.approx(1200 / 600, rel=1e-3)
    )
    assert drawn[quiet.isoformat()]["embedding"].get("data-value") == "200"

    assert numbers_in_row(html, f'<tr data-day="{busy.isoformat()}">') == [1200, 300, 1500]
    assert numbers_in_row(html, f'<tr data-day="{quiet.isoformat()}">') == [600, 200, 800]
    assert numbers_in_row(html, f'<tr data-day="{today.isoformat()}">') == [0, 0, 0]
    assert numbers_in_row(html, '<tr class="total">') == [1800, 500, 2300]

    team_quota = quota_entry(html, "team")
    assert field(team_quota, "remaining") == "7500"
    assert field(team_quota, "used") == "2500"
    assert field(team_quota, "limit") == "10000"
    assert html.count('data-scope="team"') == 1  # the key's report lists only its own entry
    key_quota = quota_entry(html, f"key {issued_key.api_key.prefix}")
    assert field(key_quota, "remaining") == "500"
    assert "Max tokens: <strong>256</strong>" in key_quota
    assert unlimited_key.prefix not in html


def test_usage_page_says_unlimited_without_limits(admin_client: Client, team: Team) -> None:
    html = admin_client.get(usage_url(team.pk)).content.decode()

    assert "Team: <strong>unlimited</strong>" in html
    assert "No key of this team has its own limits." in html


@pytest.mark.parametrize(("days", "bars"), [(None, 30), (7, 7), (1000, 366), ("soon", 30), (0, 1)])
def test_usage_page_days_parameter(
    admin_client: Client, team: Team, days: int | str | None, bars: int
) -> None:
    response = admin_client.get(usage_url(team.pk, days))

    assert response.status_code == 200
    assert len(bars_of(svg_of(response.content.decode()))) == bars


def test_team_change_page_and_list_link_to_usage(admin_client: Client, team: Team) -> None:
    link = f'href="{usage_url(team.pk)}"'

    change = admin_client.get(reverse("admin:accounts_team_change", args=[team.pk]))
    assert link in change.content.decode()
    changelist = admin_client.get(reverse("admin:accounts_team_changelist"))
    assert link in changelist.content.decode()


def test_usage_page_is_for_staff_only(client: Client, team: Team, django_user_model: Any) -> None:
    url = usage_url(team.pk)
    login = reverse("admin:login")

    anonymous = client.get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(login)

    client.force_login(django_user_model.objects.create_user(username="member", password="x"))
    member = client.get(url)
    assert member.status_code == 302 and member["Location"].startswith(login)


def test_usage_page_needs_view_permission_on_teams(
    client: Client, team: Team, django_user_model: Any
) -> None:
    staff = django_user_model.objects.create_user(username="staff", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get(usage_url(team.pk)).status_code == 403

    staff.user_permissions.add(Permission.objects.get(codename="view_team"))
    assert client.get(usage_url(team.pk)).status_code == 200


def test_usage_page_of_another_or_no_team(
    admin_client: Client, team: Team, other_team: Team
) -> None:
    today = timezone.now().astimezone(UTC).date()
    record(other_team, "chat", at=datetime.combine(today, time(0, 1, tzinfo=UTC)), prompt=4321)

    missing = Team.objects.order_by("-pk").values_list("pk", flat=True).first()
    assert missing is not None
    assert admin_client.get(usage_url(missing + 1)).status_code == 404
    own = admin_client.get(usage_url(team.pk)).content.decode()
    assert numbers_in_row(own, '<tr class="total">') == [0, 0, 0]
    other = admin_client.get(usage_url(other_team.pk)).content.decode()
    assert numbers_in_row(other, '<tr class="total">') == [4321, 0, 4321]


def test_chart_scales_to_a_round_maximum_and_stacks_in_series_order() -> None:
    chart = stacked_bar_chart(
        series=[Series("chat", "#111"), Series("embedding", "#222")],
        points=[
            ChartPoint("a", "a", {"chat": 900, "embedding": 300}),
            ChartPoint("b", "b", {"chat": 0, "embedding": 0}),
        ],
        x_title="day",
        y_title="tokens",
    )

    assert chart.y_max == 1500 and [t.label for t in chart.y_ticks] == ["0", "500", "1k", "1.5k"]
    chat, embedding = chart.bars[0].segments
    assert (chat.series, embedding.series) == ("chat", "embedding")
    assert chat.y + chat.height == pytest.approx(chart.bottom)  # first series at the bottom
    assert embedding.y + embedding.height == pytest.approx(chat.y)
    assert chat.height + embedding.height == pytest.approx(chart.plot_height * 1200 / 1500)
    assert chart.bars[1].segments == []
    assert (compact(999), compact(2_500_000)) == ("999", "2.5M")
