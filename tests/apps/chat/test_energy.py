"""An answer's ledger row takes the energy the machine's counter measured while the answer
was at the tier (here a fake powercap folder that the fake tier moves as each request
arrives), else the table's estimate, and says which."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import apps.usage.energy  # noqa: F401 - its settings receiver rebuilds the meter per test
from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.usage.models import UsageRecord
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_powercap import FakePowercap
from tests.fake_upstream import FakeUpstream

J = 1_000_000  # microjoules


def ask(http: httpx.Client) -> UsageRecord:
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0)
    assert frames[-1]["event"] == "done"
    message_id = str(frames[0]["data"]["message_id"])
    return UsageRecord.objects.get(kind="chat", object_id=message_id)


@pytest.fixture
def powercap(settings: Any, tmp_path: Path) -> FakePowercap:
    powercap = FakePowercap.make(tmp_path / "powercap")
    powercap.set(1_000 * J)
    settings.ENERGY_SOURCE = "rapl"
    settings.ENERGY_POWERCAP_ROOT = str(powercap.root)
    return powercap


def test_an_answer_is_charged_the_joules_the_counter_moved_while_it_ran(
    upstream: FakeUpstream, http: httpx.Client, powercap: FakePowercap
) -> None:
    upstream.on_request = lambda body: powercap.add(72 * J)  # 72 J: 0.02 Wh
    row = ask(http)
    assert row.energy_source == "rapl"
    assert row.energy_wh == pytest.approx(0.02)
    powercap.add(3_600 * J)  # between answers: nobody's
    upstream.on_request = lambda body: powercap.add(36 * J)
    assert ask(http).energy_wh == pytest.approx(0.01)


def test_answers_of_two_teams_at_once_share_what_moved_and_nothing_twice(
    upstream: FakeUpstream,
    http: httpx.Client,
    asgi_server: str,
    team: Team,
    other_team: Team,
    powercap: FakePowercap,
) -> None:
    """Four answers overlapping, two teams': each request moves the counter while its
    answer (and maybe others) runs. However they overlap, every joule is charged once:
    the rows add up to what the counter moved."""
    upstream.script.tokens = [f" w{i}" for i in range(6)]
    upstream.script.delay = 0.03
    upstream.on_request = lambda body: powercap.add(len(upstream.requests) * 9 * J)
    secret = api_key_create(team=other_team, name="other").secret
    headers = {"Authorization": f"Bearer {secret}"}
    with (
        httpx.Client(base_url=asgi_server, headers=headers, timeout=30) as other,
        ThreadPoolExecutor(4) as pool,
    ):
        rows = list(pool.map(ask, [http, other, http, other]))
    assert {row.team_id for row in rows} == {team.pk, other_team.pk}
    assert {row.energy_source for row in rows} == {"rapl"}
    assert all(row.energy_wh > 0 for row in rows)
    assert sum(row.energy_wh for row in rows) == pytest.approx((9 + 18 + 27 + 36) / 3600)


def test_an_unreadable_counter_leaves_the_table_estimate(
    upstream: FakeUpstream,
    http: httpx.Client,
    powercap: FakePowercap,
    settings: Any,
) -> None:
    settings.MODEL_ENERGY_WH_PER_1K_TOKENS = {"small": 2.0}

    def unreadable(body: dict[str, Any]) -> None:
        powercap.counter().unlink()
        powercap.counter().mkdir()  # reading it fails (as a counter only root may read)

    upstream.on_request = unreadable
    row = ask(http)
    assert row.energy_source == "estimated"
    assert row.energy_wh == pytest.approx((row.prompt_tokens + row.completion_tokens) / 500)


def test_the_table_when_no_counter_is_chosen(
    upstream: FakeUpstream, http: httpx.Client, settings: Any
) -> None:
    settings.ENERGY_SOURCE = "table"
    settings.MODEL_ENERGY_WH_PER_1K_TOKENS = {"small": 1.0}
    row = ask(http)
    assert row.energy_source == "estimated"
    assert row.energy_wh == pytest.approx((row.prompt_tokens + row.completion_tokens) / 1000)
