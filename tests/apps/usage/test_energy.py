from typing import Any

import pytest

from apps.accounts.models import Team
from apps.usage.services import usage_record_chat, usage_record_embedding
from apps.usage.values import Usage
from inference.energy import Measured

pytestmark = pytest.mark.django_db

USAGE = Usage(prompt_tokens=600, completion_tokens=400)


def test_a_measured_answer_keeps_the_counters_figure_and_names_it(
    team: Team, settings: Any
) -> None:
    settings.MODEL_ENERGY_WH_PER_1K_TOKENS = {"small": 5.0}
    row = usage_record_chat(
        team=team,
        model="small",
        usage=USAGE,
        status="ok",
        object_id="1",
        measured=Measured(joules=90.0, source="rapl"),
    )
    assert (row.energy_source, row.energy_wh) == ("rapl", pytest.approx(0.025))


def test_unmeasured_rows_are_estimated_from_the_table(team: Team, settings: Any) -> None:
    settings.MODEL_ENERGY_WH_PER_1K_TOKENS = {"small": 5.0, "minilm": 0.5}
    chat = usage_record_chat(team=team, model="small", usage=USAGE, status="ok", object_id="1")
    assert (chat.energy_source, chat.energy_wh) == ("estimated", pytest.approx(5.0))
    entry = usage_record_chat(
        team=team, model="small", usage=USAGE, status="ok", object_id="2", energy=2.0
    )
    assert entry.energy_wh == pytest.approx(2.0)  # the registry entry's figure first
    embedding = usage_record_embedding(team=team, model="minilm", tokens=2000, operation="query")
    assert (embedding.energy_source, embedding.energy_wh) == ("estimated", pytest.approx(1.0))


def test_an_energy_source_that_names_none_stops_manage_commands(settings: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    call_command("check")
    settings.ENERGY_SOURCE = "watts"
    with pytest.raises(SystemCheckError, match=r"usage\.E001"):
        call_command("check")
