"""Ingestion draws on the team's period quota: reserved exactly before embedding, settled on
what was embedded, refused before anything is embedded or charged."""

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.services import api_key_create
from apps.knowledge.models import Chunk, Document
from apps.knowledge.services import (
    STAGE_FUNCTIONS,
    collection_delete,
    document_create_from_text,
    document_delete,
    document_fail,
    document_ingest,
    document_reingest,
    embedder,
    stages,
)
from apps.usage.budgets import period_bounds, reservations_release_expired
from apps.usage.budgets import quota_used as counted
from apps.usage.limiters import QuotaKey
from apps.usage.models import Limit, Reservation, UsageRecord
from retrieval import Embeddings, FakeEmbedder, embedding_text
from tests import factories

pytestmark = pytest.mark.django_db


def text_of(label: str, parts: int = 6) -> str:
    return "\n\n".join(
        f"## {label} part {i}\n\n" + " ".join(f"{label}{i}x{j}" for j in range(40))
        for i in range(parts)
    )


def accepted(team: Team, label: str = "alpha", parts: int = 6) -> Document:
    collection = team.collections.first() or factories.collection(team=team)
    return document_create_from_text(
        collection=collection,
        title=label.title(),
        text=text_of(label, parts),
        format="markdown",
        enqueue=False,
    ).document


def cost_of(team: Team, label: str, parts: int = 6) -> int:
    """What a document costs, measured by ingesting the same text for another team."""
    document = document_ingest(document_id=accepted(team, label, parts).pk)
    assert document.status == "indexed"
    return document.embedding_tokens


def quota_used(team: Team) -> int:
    """What the team's daily quota counts (settled plus held), in whichever store."""
    limit = Limit.objects.get(team=team, api_key__isnull=True)
    now = timezone.now()
    starts_on, _ = period_bounds("day", now, ZoneInfo(team.time_zone))
    return counted(key=QuotaKey(limit.pk, "day", starts_on), now=now)


def ledger_tokens(team: Team) -> int:
    records = UsageRecord.objects.filter(team=team, kind="embedding", operation="ingest")
    return sum(records.values_list("prompt_tokens", flat=True))


def embedded_chunks(document: Document) -> int:
    return Chunk.objects.filter(document=document, embedding__isnull=False).count()


def crash_on_call(monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    """Make the embedder die (like a lost worker) on its ``call``-th batch."""
    model = embedder()
    real: Callable[[Sequence[str]], Embeddings] = model.embed
    calls = {"n": 0}

    def embed(texts: Sequence[str]) -> Embeddings:
        calls["n"] += 1
        if calls["n"] == call:
            raise RuntimeError("worker lost")
        return real(texts)

    monkeypatch.setattr(model, "embed", embed)


def up_to_embed(document: Document) -> None:
    STAGE_FUNCTIONS["parse"](document_id=document.pk)
    STAGE_FUNCTIONS["chunk"](document_id=document.pk)


def test_a_document_within_quota_is_indexed_and_settled_exactly(team: Team) -> None:
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = document_ingest(document_id=accepted(team).pk)

    assert document.status == "indexed"
    assert document.embedding_tokens > 0
    assert quota_used(team) == ledger_tokens(team) == document.embedding_tokens
    reservation = Reservation.objects.get(pk=document.reservation_id)
    assert reservation.kind == "embedding" and reservation.api_key_id is None
    assert reservation.settled_at is not None
    # Reserved exactly what the embedder then reported: nothing to refund.
    assert reservation.tokens == reservation.actual_tokens == document.embedding_tokens


def test_a_document_over_the_remaining_quota_fails_before_embedding(
    team: Team, other_team: Team
) -> None:
    first_cost = cost_of(other_team, "alpha")
    Limit.objects.create(team=team, daily_tokens=first_cost + 10)
    first = document_ingest(document_id=accepted(team, "alpha").pk)
    assert first.status == "indexed"
    assert quota_used(team) == first_cost

    second = document_ingest(document_id=accepted(team, "beta").pk)

    assert second.status == "failed"
    assert second.error.startswith("team_quota_exceeded: ")
    assert "retry in " in second.error and second.error.endswith(" s")
    retry = int(second.error.rsplit("retry in ", 1)[1].removesuffix(" s"))
    assert 0 < retry <= 24 * 3600
    assert second.chunk_count > 0 and embedded_chunks(second) == 0
    assert second.embedding_tokens == 0 and second.reservation_id is None
    assert not UsageRecord.objects.filter(object_id=str(second.pk)).exists()
    assert quota_used(team) == first_cost == ledger_tokens(team)
    assert Reservation.objects.filter(team=team).count() == 1  # the first document's
    # Nothing is lost: the row and its stored source stay for a later re-ingest.
    assert second.source.storage.exists(second.source.name)


def test_a_second_document_fits_exactly_at_the_limit(team: Team, other_team: Team) -> None:
    limit = cost_of(other_team, "alpha") + cost_of(other_team, "beta")
    Limit.objects.create(team=team, daily_tokens=limit)

    first = document_ingest(document_id=accepted(team, "alpha").pk)
    second = document_ingest(document_id=accepted(team, "beta").pk)

    assert (first.status, second.status) == ("indexed", "indexed")
    assert quota_used(team) == ledger_tokens(team) == limit
    third = document_ingest(document_id=accepted(team, "gamma", parts=1).pk)
    assert third.status == "failed" and "team_quota_exceeded" in third.error
    assert quota_used(team) == limit


def test_one_token_short_of_the_limit_is_refused(team: Team, other_team: Team) -> None:
    limit = cost_of(other_team, "alpha") + cost_of(other_team, "beta") - 1
    Limit.objects.create(team=team, daily_tokens=limit)
    document_ingest(document_id=accepted(team, "alpha").pk)
    used = quota_used(team)

    second = document_ingest(document_id=accepted(team, "beta").pk)

    assert second.status == "failed" and embedded_chunks(second) == 0
    assert quota_used(team) == used == ledger_tokens(team)


def test_a_resumed_embed_stage_reserves_once(
    team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.EMBED_BATCH_SIZE = 2
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = accepted(team)
    up_to_embed(document)
    crash_on_call(monkeypatch, call=2)
    with pytest.raises(RuntimeError):
        STAGE_FUNCTIONS["embed"](document_id=document.pk)  # one batch committed, then lost
    document.refresh_from_db()
    assert embedded_chunks(document) == 2 and document.reservation_id is not None
    held = quota_used(team)
    assert held > document.embedding_tokens > 0  # the whole document is held, not a batch

    STAGE_FUNCTIONS["embed"](document_id=document.pk)  # re-delivered
    STAGE_FUNCTIONS["embed"](document_id=document.pk)  # and once more, after it finished
    STAGE_FUNCTIONS["index"](document_id=document.pk)

    document.refresh_from_db()
    assert document.status == "indexed"
    reservation = Reservation.objects.get(team=team)  # one, not one per delivery
    assert reservation.tokens == held == document.embedding_tokens
    assert reservation.actual_tokens == document.embedding_tokens
    assert quota_used(team) == ledger_tokens(team) == document.embedding_tokens


def test_a_document_resumed_without_a_reservation_reserves_what_it_will_cost(
    team: Team, settings: Any
) -> None:
    """A run that embedded a batch before holding anything (e.g. begun before this code
    shipped) reserves what it spent plus what is left, and settles on the same."""
    settings.EMBED_BATCH_SIZE = 2
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = accepted(team)
    up_to_embed(document)
    first = list(Chunk.objects.filter(document=document)[:2])
    for chunk in first:
        chunk.embedding = b"\0" * (384 * 4)
    Chunk.objects.bulk_update(first, ["embedding"])
    Document.objects.filter(pk=document.pk).update(embedding_tokens=7)

    document = document_ingest(document_id=document.pk)

    reservation = Reservation.objects.get(team=team)
    assert reservation.tokens == reservation.actual_tokens == document.embedding_tokens
    assert quota_used(team) == ledger_tokens(team) == document.embedding_tokens


def test_a_batch_landing_while_counting_is_counted_again_under_the_lock(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another delivery of the stage commits a batch between this one's read of the
    document and its count of the pending chunks: the count under the lock corrects it."""
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = accepted(team)
    up_to_embed(document)
    real_cost = stages._embedding_cost
    landed: list[int] = []

    def cost_after_a_concurrent_batch(document: Document) -> int:
        if not landed:
            chunk = Chunk.objects.filter(document=document).first()
            assert chunk is not None
            embedded = embedder().embed(
                [embedding_text(document.title, tuple(chunk.headings), chunk.text)]
            )
            Chunk.objects.filter(pk=chunk.pk).update(embedding=embedded.vectors[0].tobytes())
            Document.objects.filter(pk=document.pk).update(embedding_tokens=embedded.token_count)
            landed.append(embedded.token_count)
        return real_cost(document)

    monkeypatch.setattr(stages, "_embedding_cost", cost_after_a_concurrent_batch)
    document = document_ingest(document_id=document.pk)

    assert landed and document.status == "indexed"
    reservation = Reservation.objects.get(team=team)
    assert reservation.tokens == reservation.actual_tokens == document.embedding_tokens


def test_a_reservation_released_mid_run_is_taken_again(
    team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.EMBED_BATCH_SIZE = 2
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = accepted(team)
    up_to_embed(document)
    crash_on_call(monkeypatch, call=2)
    with pytest.raises(RuntimeError):
        STAGE_FUNCTIONS["embed"](document_id=document.pk)
    # The worker stays down past the reservation's lifetime: the sweep gives it back.
    assert reservations_release_expired(now=timezone.now() + timedelta(days=1)) == 1
    assert quota_used(team) == 0

    document = document_ingest(document_id=document.pk)

    assert document.status == "indexed"
    assert Reservation.objects.filter(team=team).count() == 2
    assert quota_used(team) == ledger_tokens(team) == document.embedding_tokens


def test_a_document_refused_by_the_quota_reserves_afresh_when_reingested(
    team: Team, other_team: Team
) -> None:
    Limit.objects.create(team=team, daily_tokens=10)
    failed = document_ingest(document_id=accepted(team).pk)
    assert failed.status == "failed"
    Limit.objects.filter(team=team).update(daily_tokens=100_000)

    document = document_ingest(document_id=document_reingest(document=failed).pk)

    assert document.status == "indexed" and document.error == ""
    assert Reservation.objects.get(team=team).pk == document.reservation_id
    assert quota_used(team) == ledger_tokens(team) == document.embedding_tokens


def test_reingesting_an_indexed_document_reserves_and_charges_again(team: Team) -> None:
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = document_ingest(document_id=accepted(team).pk)
    first_reservation = document.reservation_id

    document = document_ingest(document_id=document_reingest(document=document).pk)

    assert document.status == "indexed" and document.reservation_id != first_reservation
    assert quota_used(team) == ledger_tokens(team) == 2 * document.embedding_tokens


@pytest.mark.parametrize("ending", ["delete", "collection", "fail"])
def test_a_document_ended_mid_embedding_settles_on_what_it_spent(
    team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    settings.EMBED_BATCH_SIZE = 2
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = accepted(team)
    up_to_embed(document)
    crash_on_call(monkeypatch, call=2)
    with pytest.raises(RuntimeError):
        STAGE_FUNCTIONS["embed"](document_id=document.pk)
    document.refresh_from_db()
    spent = document.embedding_tokens
    reservation = Reservation.objects.get(pk=document.reservation_id)
    assert reservation.tokens > spent > 0

    if ending == "delete":
        document_id = document.pk
        document_delete(document=document)
        assert not Document.objects.filter(pk=document_id).exists()
    elif ending == "collection":  # its collection deleted under it: billed all the same
        document_id = document.pk
        collection_delete(collection=document.collection)
        assert not Document.objects.filter(pk=document_id).exists()
    else:
        document_fail(document_id=document.pk, error="stalled")

    reservation.refresh_from_db()
    assert reservation.settled_at is not None and reservation.actual_tokens == spent
    assert quota_used(team) == ledger_tokens(team) == spent
    status = "error" if ending == "fail" else "cancelled"
    assert UsageRecord.objects.get(team=team).status == status


def test_a_document_ended_before_embedding_releases_its_whole_reservation(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    Limit.objects.create(team=team, daily_tokens=100_000)
    document = accepted(team)
    up_to_embed(document)
    crash_on_call(monkeypatch, call=1)  # reserved, then lost before the first batch
    with pytest.raises(RuntimeError):
        STAGE_FUNCTIONS["embed"](document_id=document.pk)
    assert quota_used(team) > 0

    document_delete(document=document)

    assert Reservation.objects.get(team=team).actual_tokens == 0
    assert quota_used(team) == ledger_tokens(team) == 0


def test_a_team_without_limits_ingests_with_a_reservation(team: Team) -> None:
    document = document_ingest(document_id=accepted(team).pk)
    assert document.status == "indexed"
    reservation = Reservation.objects.get(pk=document.reservation_id)
    assert reservation.actual_tokens == document.embedding_tokens == ledger_tokens(team)


TEXTS = [
    "",
    "hello world",
    "Title\n\nHeading\n\n" + "word " * 20,
    "long " * 1000,  # past the model's limit: truncated, and counted as truncated
    "ünïcödé, punctuation!? and numbers 3.14",
]


def test_the_fake_embedder_reserves_exactly_what_it_reports() -> None:
    model = FakeEmbedder(max_tokens=64)
    for text in TEXTS:
        assert model.count_embedding_tokens([text]) == model.embed([text]).token_count, text
    assert model.count_embedding_tokens(TEXTS) == model.embed(TEXTS).token_count


@pytest.mark.integration
def test_the_real_embedder_reserves_exactly_what_it_reports(real_embedder: None) -> None:
    model = embedder()
    chunk_texts = [embedding_text("Doc", ("Part",), text) for text in TEXTS]
    for text in TEXTS + chunk_texts:
        assert model.count_embedding_tokens([text]) == model.embed([text]).token_count, text
    assert model.count_embedding_tokens(TEXTS) == model.embed(TEXTS).token_count


def test_an_upload_by_a_key_draws_on_the_keys_own_limits_too(team: Team) -> None:
    """A key's budget binds what it uploads, as it binds what it asks: the key's quota
    refuses the document before anything is embedded; the ledger names the key."""
    issued = api_key_create(team=team, name="uploader")
    Limit.objects.create(team=team, api_key=issued.api_key, daily_tokens=10)
    document = accepted(team)
    Document.objects.filter(pk=document.pk).update(api_key=issued.api_key)
    refused = document_ingest(document_id=document.pk)
    assert refused.status == "failed" and "key_quota_exceeded" in refused.error
    assert embedded_chunks(refused) == 0 and not UsageRecord.objects.exists()
    Limit.objects.filter(api_key=issued.api_key).update(daily_tokens=100_000)
    done = document_ingest(document_id=document_reingest(document=refused).pk)
    assert done.status == "indexed"
    row = UsageRecord.objects.get(operation="ingest")
    assert row.api_key == issued.api_key
    assert Reservation.objects.get(pk=done.reservation_id).api_key == issued.api_key
