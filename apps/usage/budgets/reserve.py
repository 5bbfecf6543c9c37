"""Reserve: one atomic, all-or-nothing hold over every limit of a caller, in the database
or in one Redis call, or a refusal that says when to retry."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.core.exceptions import InvalidRequest
from apps.core.group_commit import budget_writer
from apps.core.ids import key_take
from apps.usage import metrics, statements
from apps.usage.budgets.counters import counter_charge
from apps.usage.budgets.holds import Hold, hold_keep, holds
from apps.usage.budgets.refusals import AdmissionUnavailable, refuse
from apps.usage.limiters import (
    TOKENS,
    USD,
    Bucket,
    Limiter,
    LimiterUnavailable,
    Quota,
    QuotaKey,
    QuotaUnseeded,
    RedisLimiter,
    Refusal,
    Slot,
    buckets_and_slots,
    limiter,
)
from apps.usage.limits import limit_periods, limits_of
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord
from apps.usage.periods import period_bounds
from apps.usage.values import nanos_of

logger = logging.getLogger(__name__)

LIMITER_RETRY_SECONDS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ask:
    """One reservation asked for: by whom, what for, how many tokens costing how many
    nano-dollars at most, against what."""

    team: Team
    api_key: ApiKey | None
    kind: str
    tokens: int
    nanos: int
    held: Hold
    now: datetime

    def row(
        self,
        *,
        token: uuid.UUID,
        store: str,
        counters: Sequence[int | str],
        expires_at: datetime,
    ) -> Reservation:
        """The ``Reservation`` row this ask becomes (not saved); ``counters``: each quota's,
        in :attr:`Hold.quotas`' order (a database id, or a Redis name)."""
        by_unit = list(zip(self.held.quotas, counters, strict=True))
        return Reservation(
            team=self.team,
            api_key=self.api_key,
            kind=self.kind,
            token=token,
            tokens=self.tokens,
            cost_nanos=self.nanos,
            store=store,
            buckets=[b.limit_id for b in self.held.buckets],
            slots=[s.limit_id for s in self.held.slots],
            counters=[c for quota, c in by_unit if quota.key.unit == TOKENS],
            cost_counters=[c for quota, c in by_unit if quota.key.unit == USD],
            created_at=self.now,
            expires_at=expires_at,
        )

    def amount(self, quota: Quota) -> int:
        return quota.amount(tokens=self.tokens, nanos=self.nanos)


def budget_reserve(
    *,
    team: Team,
    api_key: ApiKey | None,
    tokens: int,
    cost: Decimal = Decimal(0),
    kind: str = UsageRecord.Kind.CHAT,
    now: datetime | None = None,
    limits: list[Limit] | None = None,
    tag: str = "",
    defer_record: bool = False,
) -> Reservation:
    """Hold ``tokens``, costing at most ``cost`` USD, against every limit of ``team`` and
    ``api_key``, or raise 429.

    A chat generation draws on token buckets, takes a stream slot and charges the period
    quotas and money budgets; an embedding job (``kind="embedding"``) charges the period
    quotas and money budgets only.
    ``limits``: the caller's, when already read (see :func:`limits_of`); else those of the
    team, the key and ``tag`` are read.
    ``defer_record``: with Redis, do not write the ``Reservation`` row now (no database
    round trip); the caller writes it later with :func:`reservation_record`, or settling
    does. Ignored inside a transaction and with the database store (written at once).
    """
    now = now or timezone.now()
    if limits is None:
        limits = list(limits_of(team=team, api_key=api_key, tag=tag))
    buckets, slots = _draws(limits, tokens) if kind == UsageRecord.Kind.CHAT else ([], [])
    quotas = _quotas(limits, now, team)
    held = Hold(buckets, slots, quotas, deferred=False)
    ask = _Ask(
        team=team,
        api_key=api_key,
        kind=kind,
        tokens=tokens,
        nanos=nanos_of(cost),
        held=held,
        now=now,
    )
    store = limiter() if (buckets or slots or quotas) else limiter("database")
    # The database store goes through the one writer (a store passed in: Redis may be down).
    try:
        if isinstance(store, RedisLimiter):
            return _reserve_remote(store, ask, defer_record=defer_record)
        return budget_writer.run(_reserve, ask, store=store)
    except LimiterUnavailable as exc:
        if settings.RATE_LIMIT_REDIS_FALLBACK != "database":
            metrics.ADMISSION_UNAVAILABLE.inc()
            logger.warning("admission refused, the limiter is down: %s", exc)
            raise AdmissionUnavailable(
                "Rate limits cannot be checked right now; retry shortly.",
                headers={"Retry-After": str(LIMITER_RETRY_SECONDS)},
            ) from exc
        logger.warning("the limiter is down, enforcing from the database: %s", exc)
        return budget_writer.run(_reserve, ask, store=limiter("database"))


def _draws(limits: list[Limit], tokens: int) -> tuple[list[Bucket], list[Slot]]:
    """The token buckets a chat generation draws on and the stream slots it takes; 400 if
    it needs more than a bucket can ever hold."""
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    for limit in limits:
        bucket, slot = buckets_and_slots(limit)
        if bucket is not None:
            if tokens > bucket.capacity:
                raise InvalidRequest(
                    f"This request needs {tokens} tokens; the {bucket.scope}'s burst "
                    f"capacity is {bucket.capacity}.",
                    code="request_exceeds_burst_capacity",
                )
            buckets.append(bucket)
        if slot is not None:
            slots.append(slot)
    return buckets, slots


def _quotas(limits: list[Limit], now: datetime, team: Team) -> list[Quota]:
    """The period quotas of ``limits``, token quotas and money budgets."""
    zone = ZoneInfo(team.time_zone)
    found: list[Quota] = []
    for limit in limits:
        for period, unit, maximum in limit_periods(limit):
            starts_on, resets_at = period_bounds(period, now, zone)
            scope = "key" if limit.api_key_id else "team"
            key = QuotaKey(limit.pk, period, starts_on, unit)
            found.append(Quota(key, maximum, scope, resets_at))
    return found


def _reserve(ask: _Ask, *, store: Limiter) -> Reservation:
    """The database store: the row inserted last. Called through the one writer
    (:data:`budget_writer`), in a savepoint of its own: a refusal writes nothing."""
    token, held, now = uuid.uuid4(), ask.held, ask.now
    counters = [counter_charge(quota, ask.amount(quota), now) for quota in held.quotas]
    refusal = store.acquire(
        token=token, buckets=held.buckets, slots=held.slots, tokens=ask.tokens, now=now
    )
    if refusal is not None:
        refuse(refusal)
    reservation = ask.row(
        token=token,
        store=Reservation.Store.DATABASE,
        counters=counters,
        expires_at=now + timedelta(seconds=settings.RESERVATION_TTL_SECONDS),
    )
    statements.reservation_insert(reservation)
    hold_keep(reservation, held)  # settling it here needs no read of its limits
    metrics.RESERVATIONS.labels(ask.kind).inc()
    return reservation


def _reserve_remote(store: RedisLimiter, ask: _Ask, *, defer_record: bool) -> Reservation:
    """Redis: one Lua call (after seeding, on a period's first request), then the row,
    now or later."""
    token, held, now = uuid.uuid4(), ask.held, ask.now
    expires_at = now + timedelta(seconds=settings.RESERVATION_TTL_SECONDS)
    refusal = redis_admit(
        store,
        team=ask.team,
        token=token,
        held=held,
        tokens=ask.tokens,
        nanos=ask.nanos,
        now=now,
        expires_at=expires_at,
    )
    if refusal is not None:
        refuse(refusal)
    held.deferred = defer_record and not transaction.get_connection().in_atomic_block
    try:
        reservation = ask.row(
            token=token,
            store=Reservation.Store.REDIS,
            counters=[quota.key.name for quota in held.quotas],
            expires_at=expires_at,
        )
        if held.deferred:
            reservation.pk = key_take(Reservation)
        else:
            statements.reservation_insert(reservation)
    except BaseException:  # Redis said yes, the database failed: give it all back
        with contextlib.suppress(LimiterUnavailable):
            store.release(
                token=token,
                buckets=held.buckets,
                slots=held.slots,
                difference=ask.tokens,
                now=now,
                quotas=[quota.key for quota in held.quotas],
            )  # nothing used: each quota's base unchanged
        raise
    hold_keep(reservation, held)
    metrics.RESERVATIONS.labels(ask.kind).inc()
    return reservation


def redis_admit(
    store: RedisLimiter,
    *,
    team: Team,
    token: uuid.UUID,
    held: Hold,
    tokens: int,
    now: datetime,
    expires_at: datetime,
    nanos: int = 0,
) -> Refusal | None:
    """The admission script; a quota not in Redis yet is seeded and the script run again
    (each quota is seeded at most once)."""
    seeded = 0
    while True:
        try:
            return store.admit(
                token=token,
                buckets=held.buckets,
                slots=held.slots,
                quotas=held.quotas,
                tokens=tokens,
                nanos=nanos,
                now=now,
                expires_at=expires_at,
            )
        except QuotaUnseeded as missing:
            if seeded == len(held.quotas):
                raise
            seeded += 1
            _seed(store, team=team, quota=missing.quota, now=now)


def _seed(store: RedisLimiter, *, team: Team, quota: Quota, now: datetime) -> None:
    """A quota into Redis from the record: what settled (the database counter, if there is
    one yet) and what the team's open Redis reservations charged to it hold. Writes nothing
    to the database (the caller's transaction may yet roll back)."""
    key = quota.key
    used = QuotaCounter.objects.filter(
        limit_id=key.limit_id, period=key.period, starts_on=key.starts_on, unit=key.unit
    ).values_list("used", flat=True)
    name = key.name
    open_ = Reservation.objects.filter(
        team=team,
        store=Reservation.Store.REDIS,
        settled_at__isnull=True,
        expires_at__gt=now,
    ).values_list("token", "tokens", "cost_nanos", "expires_at", "counters", "cost_counters")
    held = [
        (token, quota.amount(tokens=tokens, nanos=nanos), expires)
        for token, tokens, nanos, expires, names, cost_names in open_
        if name in names or name in cost_names
    ]
    store.quota_seed(quota=quota, used=used.first() or 0, holds=held, now=now)


def reservation_record(*, reservation: Reservation) -> None:
    """Write the row of a reservation taken with ``defer_record`` (nothing otherwise, or
    if it is there already): call it off the path to the first token."""
    held = holds.get(reservation.token)
    if held is None or not held.deferred or held.written:
        return
    statements.reservation_insert(reservation)
    held.written = True
