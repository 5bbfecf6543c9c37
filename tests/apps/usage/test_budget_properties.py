"""Budgets as a state machine: random reserve/settle/expire/refill/day-turn sequences
against a Python oracle, in both limiter stores.

After every step the day's quota counts what its open reservations hold plus what its
settled ones used, never above the daily limit (with Redis, a hold past its expiry is
dropped there by itself, and the database counter records what settled), and the token
bucket holds exactly what the oracle says (capacity, minus draws, plus refunds, plus
whole-minute refills, capped). A refusal charges nothing; once everything settles the
bucket is full again.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import hypothesis
import pytest
from django.conf import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from apps.accounts.models import Team
from apps.accounts.services import team_create
from apps.core.exceptions import InvalidRequest
from apps.usage.budgets import (
    RateLimited,
    budget_extend,
    budget_reserve,
    budget_settle,
    quota_used,
    reservations_release_expired,
)
from apps.usage.limiters import Bucket, QuotaKey, buckets_and_slots, limiter
from apps.usage.models import Limit, QuotaCounter, Reservation

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DAILY, BURST, RATE = 5000, 3000, 600  # tokens; tokens per minute


@dataclass
class Held:
    """The oracle's view of one reservation."""

    reservation: Reservation
    tokens: int
    day: date  # the counter it charged
    actual: int | None = None


class BudgetMachine(RuleBasedStateMachine):
    committed: Callable[[], AbstractContextManager[Any]]  # set by the test

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.team: Team = team_create(name=f"prop-{uuid.uuid4().hex[:12]}")
        self.limit = Limit.objects.create(
            team=self.team, daily_tokens=DAILY, burst_tokens=BURST, tokens_per_minute=RATE
        )
        bucket, _ = buckets_and_slots(self.limit)
        assert bucket is not None
        self.bucket: Bucket = bucket
        self.now = T0
        self.level = BURST  # the oracle's bucket
        self.reservations: list[Held] = []
        self.remote = bool(settings.RATE_LIMIT_REDIS_URL)

    # The oracle.

    def used(self, day: date) -> int:
        return sum(self.counts(h) for h in self.reservations if h.day == day)

    def counts(self, held: Held) -> int:
        if held.actual is not None:
            return held.actual
        if self.remote and held.reservation.expires_at <= self.now:
            return 0  # Redis drops an expired hold by itself
        return held.tokens

    def settled(self, day: date) -> int:
        return sum(h.actual or 0 for h in self.reservations if h.day == day)

    def days(self) -> list[date]:
        """Every day a counter or a reservation knows, and today."""
        counters = QuotaCounter.objects.filter(limit=self.limit)
        known = {*counters.values_list("starts_on", flat=True), self.now.date()}
        return sorted(known | {h.day for h in self.reservations})

    def counted(self, day: date) -> int:
        """What the store that enforces the quota counts."""
        return quota_used(key=QuotaKey(self.limit.pk, "day", day), now=self.now)

    def open(self) -> list[Held]:
        return [h for h in self.reservations if h.actual is None]

    def advance(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)
        self.level = min(BURST, self.level + minutes * RATE)

    def settle(self, held: Held, actual: int) -> None:
        if held.actual is not None:  # settled meanwhile (expired): settling is idempotent
            before = self.snapshot()
            with self.committed():
                budget_settle(reservation=held.reservation, actual=actual, now=self.now)
            assert self.snapshot() == before, "settling twice changed something"
            return
        assert 0 <= actual <= held.tokens
        with self.committed():
            budget_settle(reservation=held.reservation, actual=actual, now=self.now)
        held.actual = actual
        self.level = min(BURST, self.level + held.tokens - actual)

    def snapshot(self) -> tuple[Any, ...]:
        counters = QuotaCounter.objects.filter(limit=self.limit).order_by("pk")
        return (
            list(counters.exclude(used=0).values_list("pk", "used")),
            [(day, used) for day in self.days() if (used := self.counted(day))],
            limiter().available(self.bucket, self.now),
            Reservation.objects.filter(team=self.team).count(),
        )

    # Rules.

    @rule(target=held, tokens=st.integers(1, 2500))
    def reserve(self, tokens: int) -> Any:
        return self.reserve_checked(tokens)

    @rule(target=held, tokens=st.integers(1000, 2500))
    def reserve_large(self, tokens: int) -> Any:
        """Large requests more often, so that both limits refuse now and then."""
        return self.reserve_checked(tokens)

    @rule(target=held, edge=st.sampled_from(["quota", "bucket"]), over=st.sampled_from([0, 1]))
    def reserve_at_the_edge(self, edge: str, over: int) -> Any:
        """Exactly what is left of the day's quota or of the bucket, or one token more."""
        room = DAILY - self.used(self.now.date()) if edge == "quota" else self.level
        if not 1 <= room + over <= BURST:
            return hypothesis.stateful.multiple()
        return self.reserve_checked(room + over)

    def reserve_checked(self, tokens: int) -> Any:
        today = self.now.date()
        before = self.snapshot()
        try:
            reservation = budget_reserve(team=self.team, api_key=None, tokens=tokens, now=self.now)
        except RateLimited as refused:
            assert self.snapshot() == before, "a refused reservation charged something"
            if self.used(today) + tokens > DAILY:  # the quota is checked first
                assert refused.code == "team_quota_exceeded"
                midnight = datetime.combine(today + timedelta(days=1), time.min, tzinfo=UTC)
                retry = math.ceil((midnight - self.now).total_seconds())
            else:
                assert self.level < tokens, f"refused with {self.level} >= {tokens} in the bucket"
                assert refused.code == "team_tokens_per_minute"
                retry = math.ceil((tokens - self.level) * 60 / RATE)
            assert refused.status == 429
            assert refused.headers["Retry-After"] == str(retry)
            return hypothesis.stateful.multiple()
        assert self.used(today) + tokens <= DAILY, "admitted over the daily quota"
        assert self.level >= tokens, f"admitted {tokens} with {self.level} in the bucket"
        assert reservation.tokens == tokens
        self.level -= tokens
        held = Held(reservation, tokens, today)
        self.reservations.append(held)
        return held

    @rule(held=consumes(held), data=st.data())
    def succeed(self, held: Held, data: st.DataObject) -> None:
        self.settle(held, data.draw(st.integers(0, held.tokens), label="actual"))

    @rule(held=consumes(held), data=st.data())
    def fail(self, held: Held, data: st.DataObject) -> None:
        """An upstream error after the prompt: a part of the reservation was used."""
        self.settle(held, data.draw(st.integers(0, held.tokens // 2), label="actual"))

    @rule(held=consumes(held), share=st.sampled_from([0.0, 0.1, 0.5, 0.9]))
    def cancel(self, held: Held, share: float) -> None:
        """The client went away mid-stream: the tokens generated so far."""
        self.settle(held, int(held.tokens * share))

    @rule(data=st.data(), tokens=st.integers(1, 1500))
    @precondition(lambda self: bool(self.open()))
    def extend(self, data: st.DataObject, tokens: int) -> None:
        """More tokens on an open reservation: against its own day's counter, all or
        nothing."""
        held = data.draw(st.sampled_from(self.open()), label="open")
        before = self.snapshot()
        if held.reservation.expires_at <= self.now:  # its holder is presumed gone
            with pytest.raises(InvalidRequest, match="expired"):
                budget_extend(reservation=held.reservation, tokens=tokens, now=self.now)
            assert self.snapshot() == before, "an expired reservation grew"
            return
        try:
            budget_extend(reservation=held.reservation, tokens=tokens, now=self.now)
        except RateLimited as refused:
            assert self.snapshot() == before, "a refused extension charged something"
            if self.used(held.day) + tokens > DAILY:
                assert refused.code == "team_quota_exceeded"
            else:
                assert self.level < tokens
                assert refused.code == "team_tokens_per_minute"
            return
        assert self.used(held.day) + tokens <= DAILY, "extended over the daily quota"
        assert self.level >= tokens, f"extended by {tokens} with {self.level} in the bucket"
        held.tokens += tokens
        self.level -= tokens

    @rule()
    def expire(self) -> None:
        """A crashed holder: past the TTL, the periodic job releases what it held."""
        ttl_minutes = settings.RESERVATION_TTL_SECONDS // 60 + 1
        self.advance(ttl_minutes)
        others = (
            Reservation.objects.filter(settled_at__isnull=True, expires_at__lt=self.now)
            .exclude(team=self.team)
            .count()
        )
        mine = self.open()
        with self.committed():
            released = reservations_release_expired(now=self.now)
        assert released == len(mine) + others
        for held in mine:
            held.actual = 0
            self.level = min(BURST, self.level + held.tokens)

    @rule(minutes=st.integers(1, 5))
    def wait(self, minutes: int) -> None:
        self.advance(minutes)

    @rule()
    def next_day(self) -> None:
        midnight = datetime.combine(self.now.date() + timedelta(days=1), time.min, tzinfo=UTC)
        self.advance(int((midnight - self.now).total_seconds()) // 60)
        assert self.now == midnight

    @rule()
    def quiesce(self) -> None:
        """Everything settles, an hour passes: nothing is held and the bucket is full."""
        for held in self.open():
            self.settle(held, held.tokens)
        self.advance(60)
        assert not Reservation.objects.filter(team=self.team, settled_at__isnull=True).exists()
        assert limiter().available(self.bucket, self.now) == BURST
        assert self.level == BURST

    # Invariants.

    @invariant()
    def counters_match_reservations(self) -> None:
        counters = QuotaCounter.objects.filter(limit=self.limit)
        assert set(counters.values_list("period", flat=True)) <= {"day"}
        recorded = dict(counters.values_list("starts_on", "used"))
        for day in self.days():
            counted = self.counted(day)
            assert counted == self.used(day), (
                f"quota of {day}: counts {counted}, reservations say {self.used(day)}"
            )
            assert counted <= DAILY
            record = self.settled(day) if self.remote else self.used(day)
            assert recorded.get(day, 0) == record, f"counter of {day}: {recorded.get(day)}"

    @invariant()
    def bucket_matches_oracle(self) -> None:
        level = limiter().available(self.bucket, self.now)
        assert level == self.level, f"bucket holds {level}, the oracle says {self.level}"
        assert level >= 0

    @invariant()
    def open_reservations_match(self) -> None:
        in_db = Reservation.objects.filter(team=self.team, settled_at__isnull=True)
        assert sorted(in_db.values_list("pk", "tokens")) == sorted(
            (h.reservation.pk, h.tokens) for h in self.open()
        )

    def teardown(self) -> None:
        self.quiesce()


@pytest.mark.django_db
def test_budgets_match_the_oracle(
    limiter_store: str, django_capture_on_commit_callbacks: Any
) -> None:
    class Machine(BudgetMachine):
        @staticmethod
        def committed() -> AbstractContextManager[Any]:  # Redis refunds wait for commit
            return django_capture_on_commit_callbacks(execute=True)  # type: ignore[no-any-return]

    run_state_machine_as_test(
        Machine,
        settings=hypothesis.settings(max_examples=25, stateful_step_count=25, deadline=None),
    )
    stores = set(Reservation.objects.values_list("store", flat=True))
    assert stores == {limiter_store}
