"""The database store's statements, written as SQL, against what the ORM reads back.

They run on whichever database the suite runs on (SQLite, and PostgreSQL in CI): the
values each statement binds come from the model fields, so a date, a UUID or a datetime
must land as the ORM would have written it and read back the same.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import transaction

from apps.accounts.models import Team
from apps.usage import statements
from apps.usage.limiters import QuotaKey
from apps.usage.models import Limit, QuotaCounter, Reservation, StreamCounter, TokenBucket

T0 = datetime(2026, 12, 2, 12, 0, 0, 250_000, tzinfo=UTC)
DAY = date(2026, 12, 2)


@pytest.fixture
def limit(team: Team) -> Limit:
    return Limit.objects.create(team=team, daily_tokens=1000, max_concurrent_streams=2)


def reservation(team: Team, **fields: object) -> Reservation:
    values: dict[str, object] = {
        "team": team,
        "token": uuid.uuid4(),
        "tokens": 100,
        "counters": [7],
        "slots": [3],
        "created_at": T0,
        "expires_at": T0 + timedelta(minutes=10),
    }
    values.update(fields)
    return Reservation(**values)


@pytest.mark.django_db
def test_a_quota_is_charged_within_its_room_and_by_its_key(limit: Limit) -> None:
    counter = QuotaCounter.objects.create(limit=limit, period="day", starts_on=DAY, used=900)
    key = QuotaKey(limit.pk, "day", DAY)

    assert statements.quota_charge(counter.pk, tokens=100, room=900, key=key)
    assert not statements.quota_charge(counter.pk, tokens=1, room=999, key=key)  # used 1000
    other_day = QuotaKey(limit.pk, "day", DAY + timedelta(days=1))
    assert not statements.quota_charge(counter.pk, tokens=1, room=10_000, key=other_day)
    assert statements.quota_record(key, tokens=5)
    assert not statements.quota_record(other_day, tokens=5)  # no row for that day

    counter.refresh_from_db()
    assert counter.used == 1005


@pytest.mark.django_db
def test_refunds_stop_at_zero_and_at_capacity(limit: Limit) -> None:
    low = QuotaCounter.objects.create(limit=limit, period="day", starts_on=DAY, used=30)
    high = QuotaCounter.objects.create(limit=limit, period="month", starts_on=DAY, used=500)
    bucket = TokenBucket.objects.create(limit=limit, level=900, refilled_at=T0)
    StreamCounter.objects.create(limit=limit, open=1)

    statements.quota_refund([low.pk, high.pk], tokens=100)
    statements.bucket_refund(limit.pk, tokens=250, capacity=1000)
    statements.slots_free([limit.pk])
    statements.slots_free([limit.pk])

    assert QuotaCounter.objects.get(pk=low.pk).used == 0
    assert QuotaCounter.objects.get(pk=high.pk).used == 400
    assert TokenBucket.objects.get(pk=bucket.pk).level == 1000
    assert StreamCounter.objects.get(limit=limit).open == 0


@pytest.mark.django_db
def test_a_bucket_reads_back_as_the_orm_wrote_it(limit: Limit) -> None:
    bucket = TokenBucket.objects.create(limit=limit, level=10, refilled_at=T0)
    assert statements.bucket_row(limit.pk) == (bucket.pk, 10, T0)

    later = T0 + timedelta(seconds=1, microseconds=5)
    with transaction.atomic():  # the row lock, where there is one
        statements.bucket_set(bucket.pk, level=3, refilled_at=later)
    bucket.refresh_from_db()
    assert (bucket.level, bucket.refilled_at) == (3, later)
    assert statements.bucket_row(limit.pk + 1000) is None


@pytest.mark.django_db
def test_stream_slots_stop_at_their_maximum(limit: Limit) -> None:
    assert not statements.slot_take(limit.pk, maximum=2)  # no counter row yet
    StreamCounter.objects.create(limit=limit)
    assert statements.slot_take(limit.pk, maximum=2)
    assert statements.slot_take(limit.pk, maximum=2)
    assert not statements.slot_take(limit.pk, maximum=2)


@pytest.mark.django_db
def test_a_reservation_is_inserted_claimed_once_and_read_back(team: Team) -> None:
    made = reservation(team)
    statements.reservation_insert(made)

    stored = Reservation.objects.get(pk=made.pk)
    assert (stored.token, stored.tokens, stored.counters, stored.slots) == (
        made.token,
        100,
        [7],
        [3],
    )
    assert (stored.created_at, stored.expires_at, stored.settled_at) == (
        T0,
        T0 + timedelta(minutes=10),
        None,
    )
    assert statements.reservation_claim(made, now=T0, actual=42, actual_cost=9) == (100, 0)
    assert statements.reservation_claim(made, now=T0, actual=43) is None
    stored.refresh_from_db()
    assert (stored.settled_at, stored.actual_tokens, stored.remote_pending) == (T0, 42, False)
    assert stored.actual_cost_nanos == 9


@pytest.mark.django_db
def test_a_reservation_with_its_key_taken_ahead_is_written_once(team: Team) -> None:
    first = reservation(team, store=Reservation.Store.REDIS, counters=["1:day:2026-12-02"])
    first.pk = 10_000
    statements.reservation_insert(first)
    assert Reservation.objects.get(token=first.token).pk == 10_000
    again = reservation(team, token=first.token, tokens=999)
    again.pk = first.pk

    statements.reservation_insert(again)  # already there: left alone

    assert Reservation.objects.get(pk=first.pk).tokens == 100
    assert Reservation.objects.count() == 1
