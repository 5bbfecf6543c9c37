"""How full each answer's window ran, and what it cut: ``context_window``,
``dropped_passages``, ``dropped_turns`` (and ``tag``) on the ``usage`` event and the ledger
row, and the ``ragtier_context_fill`` histogram."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from apps.accounts.models import Team
from apps.usage.models import UsageRecord
from tests import factories
from tests.apps.chat.conftest import ask_stream, conversation_for
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def fill_count(model: str) -> float:
    value = REGISTRY.get_sample_value("ragtier_context_fill_count", {"model": model})
    return value or 0.0


def test_a_roomy_window_cuts_nothing_and_says_so(
    upstream: FakeUpstream, http: httpx.Client, team: Team
) -> None:
    before = fill_count("small")
    frames = ask_stream(http, conversation_for(http), content="Hi", top_k=0, tag="docs")
    usage = next(f["data"] for f in frames if f["event"] == "usage")
    assert usage["dropped_passages"] == usage["dropped_turns"] == usage["summarized_turns"] == 0
    assert usage["context_window"] > usage["prompt_tokens"] > 0 and usage["tag"] == "docs"
    row = UsageRecord.objects.get(kind="chat")
    assert (row.context_window, row.dropped_passages, row.dropped_turns) == (
        usage["context_window"],
        0,
        0,
    )
    assert fill_count("small") == before + 1


def test_a_tight_window_reports_the_passages_and_turns_it_left_out(
    upstream: FakeUpstream, http: httpx.Client, team: Team, settings: Any
) -> None:
    collection = factories.collection(team=team, name="facts")
    for number in range(6):
        text = f"Fact {number} about the pantry key. " + "filler words here " * 40
        factories.document(collection=collection, title=f"Fact {number}", text=text)
    conversation = conversation_for(http)
    for turn in range(4):  # history to cut
        ask_stream(http, conversation, content=f"Earlier question {turn} " + "pad " * 120, top_k=0)
    settings.MODEL_ALIASES = {
        "small": {**settings.MODEL_ALIASES["small"], "context_window": 420, "max_output_tokens": 20}
    }
    frames = ask_stream(http, conversation, content="Where is the pantry key?", top_k=5)
    usage = next(f["data"] for f in frames if f["event"] == "usage")
    assert usage["context_window"] == 420
    assert usage["dropped_passages"] > 0 and usage["dropped_turns"] > 0
    citations = next(f["data"]["citations"] for f in frames if f["event"] == "retrieval")
    assert len(citations) + usage["dropped_passages"] == 5
    row = UsageRecord.objects.filter(kind="chat").order_by("pk").last()
    assert row is not None
    assert (row.dropped_passages, row.dropped_turns) == (
        usage["dropped_passages"],
        usage["dropped_turns"],
    )
