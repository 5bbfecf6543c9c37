"""Token budgets: reserve before calling the model, settle on actual usage.

Reserve is one atomic, all-or-nothing step over every limit that applies (the team's and
the key's): period quotas, token buckets and stream slots. Nothing is read and then
written unlocked, so concurrent requests can never overspend. A refusal says when to
retry.

- Embedded default (the database store): one short transaction. Each quota moves by a
  conditional ``UPDATE … SET used = used + n WHERE used + n <= limit``, buckets and slots
  are locked rows (:class:`apps.usage.limiters.DatabaseLimiter`), then the
  ``Reservation`` row is inserted; a refusal rolls it all back.
- Redis (:class:`apps.usage.limiters.RedisLimiter`): one Lua call checks and charges the
  quotas, buckets and slots; no database round trip. A quota missing from Redis (the
  first request of a period) is seeded from the database first. The ``Reservation`` row,
  the record, may be written later (``defer_record``: its key is taken ahead, see
  :mod:`apps.core.ids`; the answer path writes it with the message rows, while the tier
  prefills): settling writes it if it is not there yet. A process that dies before
  writing it leaves Redis holds that expire on their own (slots and quota holds carry
  their expiry). The database counter of a quota records what settled; Redis adds the
  open holds. The periodic job resets Redis's settled part to the record.

Settling replaces the reservation with what was really used, exactly once (a conditional
``UPDATE`` claims it): the database counter and, for Redis, one Lua call that refunds the
bucket, frees the slot and turns the quota hold into what was used, inside the caller's
transaction (which writes the ledger row). Reservations a crashed process never settled
expire and are released by the periodic job, which also retries Redis refunds that found
Redis down and reconciles Redis's quota counters with the database. When Redis is
unreachable at admission, requests fail closed with 503 unless
``RATE_LIMIT_REDIS_FALLBACK`` is ``database``: then the database enforces every limit
until Redis returns (its quota counters hold what settled and what it reserved itself,
not what Redis holds for requests still in flight; Redis learns what the database charged
meanwhile at the next reconciliation).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from time import monotonic
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet, signals
from django.utils import timezone

from apps.accounts.models import ApiKey, Team
from apps.core.exceptions import ApplicationError, InvalidRequest
from apps.core.group_commit import budget_writer
from apps.core.ids import key_take
from apps.usage import metrics, statements
from apps.usage.limiters import (
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
from apps.usage.models import Limit, QuotaCounter, Reservation, UsageRecord

logger = logging.getLogger(__name__)

LIMITER_RETRY_SECONDS = 5


class RateLimited(ApplicationError):
    status, type, code = 429, "rate_limit_error", "team_tokens_per_minute"


class AdmissionUnavailable(ApplicationError):
    """The store that enforces a limit is down: fail closed rather than let requests
    through unchecked."""

    status, type, code = 503, "overloaded", "rate_limiter_unavailable"


def limits_of(*, team: Team, api_key: ApiKey | None) -> QuerySet[Limit]:
    """The limits that apply to a caller: the team's, and the key's when there is one."""
    if api_key is None:
        return Limit.objects.filter(team=team, api_key__isnull=True)
    return Limit.objects.filter(Q(team=team, api_key__isnull=True) | Q(api_key=api_key))


class LimitsCache:
    """The limits of each caller (team, key) as read in the last ``LIMITS_CACHE_SECONDS``
    (5 by default; 0 turns it off), so that an answer reads none before its first token.
    A limit saved or deleted in this process applies at once (the cache is cleared); one
    changed in another process, within the cache time, like a key's revocation. Bounded:
    past ``max_entries`` callers it starts afresh."""

    def __init__(
        self, *, max_entries: int = 10_000, clock: Callable[[], float] = monotonic
    ) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[tuple[int, int | None], tuple[float, list[Limit]]] = {}
        self._lock = threading.Lock()

    def get(self, *, team: Team, api_key: ApiKey | None) -> list[Limit]:
        ttl: float = settings.LIMITS_CACHE_SECONDS
        key = (team.pk, api_key.pk if api_key is not None else None)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is not None and now - entry[0] < ttl:
            return entry[1]
        limits = list(limits_of(team=team, api_key=api_key))
        if ttl > 0:
            with self._lock:
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
                self._entries[key] = (now, limits)
        return limits

    def clear(self, **_: object) -> None:
        with self._lock:
            self._entries.clear()


limits_cache = LimitsCache()
signals.post_save.connect(limits_cache.clear, sender=Limit, weak=False)
signals.post_delete.connect(limits_cache.clear, sender=Limit, weak=False)


def max_tokens_cap(*, limits: Iterable[Limit]) -> int | None:
    """The tightest ``max_tokens`` cap of a caller's limits; None when there is none."""
    known = [int(limit.max_tokens) for limit in limits if limit.max_tokens is not None]
    return min(known) if known else None


@dataclass
class _Hold:
    """What this process knows of a reservation it took: enough to extend and settle it
    without reading the limits again and, for Redis, whether its row may not be written
    yet (``deferred``: this object is the record until it is)."""

    buckets: list[Bucket]
    slots: list[Slot]
    quotas: list[Quota]
    deferred: bool
    written: bool = False
    settled: bool = False


# The reservations this process took, by token (each gone with the object it returned).
_holds: dict[uuid.UUID, _Hold] = {}


def _hold(reservation: Reservation, held: _Hold) -> None:
    _holds[reservation.token] = held
    weakref.finalize(reservation, _holds.pop, reservation.token, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ask:
    """One reservation asked for: by whom, what for, how many tokens, against what."""

    team: Team
    api_key: ApiKey | None
    kind: str
    tokens: int
    held: _Hold
    now: datetime

    def row(
        self, *, token: uuid.UUID, store: str, counters: list[int] | list[str], expires_at: datetime
    ) -> Reservation:
        """The ``Reservation`` row this ask becomes (not saved)."""
        return Reservation(
            team=self.team,
            api_key=self.api_key,
            kind=self.kind,
            token=token,
            tokens=self.tokens,
            store=store,
            buckets=[b.limit_id for b in self.held.buckets],
            slots=[s.limit_id for s in self.held.slots],
            counters=counters,
            created_at=self.now,
            expires_at=expires_at,
        )


# Database counter ids by quota, so that charging one is a single UPDATE.
_counter_ids: dict[QuotaKey, int] = {}
_COUNTER_IDS_KEPT = 10_000


def budget_reserve(
    *,
    team: Team,
    api_key: ApiKey | None,
    tokens: int,
    kind: str = UsageRecord.Kind.CHAT,
    now: datetime | None = None,
    limits: list[Limit] | None = None,
    defer_record: bool = False,
) -> Reservation:
    """Hold ``tokens`` against every limit of ``team`` and ``api_key``, or raise 429.

    A chat generation draws on token buckets, takes a stream slot and charges the period
    quotas; an embedding job (``kind="embedding"``) charges the period quotas only.
    ``limits``: the caller's, when already read (see :func:`limits_of`).
    ``defer_record``: with Redis, do not write the ``Reservation`` row now (no database
    round trip); the caller writes it later with :func:`reservation_record`, or settling
    does. Ignored inside a transaction and with the database store (written at once).
    """
    now = now or timezone.now()
    if limits is None:
        limits = list(limits_of(team=team, api_key=api_key))
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    if kind == UsageRecord.Kind.CHAT:
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
    quotas = _quotas(limits, now, team)
    held = _Hold(buckets, slots, quotas, deferred=False)
    ask = _Ask(team=team, api_key=api_key, kind=kind, tokens=tokens, held=held, now=now)
    store = limiter() if (buckets or slots or quotas) else limiter("database")
    # The database store, through the one writer (a store passed in: Redis may be down).
    reserve_local = functools.partial(budget_writer.run, _reserve, ask)
    try:
        if isinstance(store, RedisLimiter):
            return _reserve_remote(store, ask, defer_record=defer_record)
        return reserve_local(store=store)
    except LimiterUnavailable as exc:
        if settings.RATE_LIMIT_REDIS_FALLBACK != "database":
            metrics.ADMISSION_UNAVAILABLE.inc()
            logger.warning("admission refused, the limiter is down: %s", exc)
            raise AdmissionUnavailable(
                "Rate limits cannot be checked right now; retry shortly.",
                headers={"Retry-After": str(LIMITER_RETRY_SECONDS)},
            ) from exc
        logger.warning("the limiter is down, enforcing from the database: %s", exc)
        return reserve_local(store=limiter("database"))


def _quotas(limits: list[Limit], now: datetime, team: Team) -> list[Quota]:
    zone = ZoneInfo(team.time_zone)
    found: list[Quota] = []
    for limit in limits:
        for period, maximum in (("day", limit.daily_tokens), ("month", limit.monthly_tokens)):
            if maximum is not None:
                starts_on, resets_at = period_bounds(period, now, zone)
                scope = "key" if limit.api_key_id else "team"
                key = QuotaKey(limit.pk, period, starts_on)
                found.append(Quota(key, int(maximum), scope, resets_at))
    return found


def _reserve(ask: _Ask, *, store: Limiter) -> Reservation:
    """The database store: the row inserted last. Called through the one writer
    (:data:`budget_writer`), in a savepoint of its own: a refusal writes nothing."""
    token, held, now = uuid.uuid4(), ask.held, ask.now
    counters = [_charge(quota, ask.tokens, now) for quota in held.quotas]
    refusal = store.acquire(
        token=token, buckets=held.buckets, slots=held.slots, tokens=ask.tokens, now=now
    )
    if refusal is not None:
        _refuse(refusal)
    reservation = ask.row(
        token=token,
        store=Reservation.Store.DATABASE,
        counters=counters,
        expires_at=now + timedelta(seconds=settings.RESERVATION_TTL_SECONDS),
    )
    statements.reservation_insert(reservation)
    _hold(reservation, held)  # settling it here needs no read of its limits
    metrics.RESERVATIONS.labels(ask.kind).inc()
    return reservation


def _reserve_remote(store: RedisLimiter, ask: _Ask, *, defer_record: bool) -> Reservation:
    """Redis: one Lua call (after seeding, on a period's first request), then the row,
    now or later."""
    token, held, now = uuid.uuid4(), ask.held, ask.now
    expires_at = now + timedelta(seconds=settings.RESERVATION_TTL_SECONDS)
    refusal = _admit(
        store,
        team=ask.team,
        token=token,
        held=held,
        tokens=ask.tokens,
        now=now,
        expires_at=expires_at,
    )
    if refusal is not None:
        _refuse(refusal)
    held.deferred = defer_record and not transaction.get_connection().in_atomic_block
    try:
        reservation = ask.row(
            token=token,
            store=Reservation.Store.REDIS,
            counters=[quota_name(quota.key) for quota in held.quotas],
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
            )
        raise
    _hold(reservation, held)
    metrics.RESERVATIONS.labels(ask.kind).inc()
    return reservation


def _admit(
    store: RedisLimiter,
    *,
    team: Team,
    token: uuid.UUID,
    held: _Hold,
    tokens: int,
    now: datetime,
    expires_at: datetime,
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
        limit_id=key.limit_id, period=key.period, starts_on=key.starts_on
    ).values_list("used", flat=True)
    name = quota_name(key)
    open_ = Reservation.objects.filter(
        team=team,
        store=Reservation.Store.REDIS,
        settled_at__isnull=True,
        expires_at__gt=now,
    ).values_list("token", "tokens", "expires_at", "counters")
    holds = [(token, tokens, expires) for token, tokens, expires, names in open_ if name in names]
    store.quota_seed(quota=quota, used=used.first() or 0, holds=holds, now=now)


def quota_name(key: QuotaKey) -> str:
    """How a Redis reservation names a quota it charged (its ``counters``): the counter's
    row may not exist until something settles on it."""
    return f"{key.limit_id}:{key.period}:{key.starts_on.isoformat()}"


def _quota_key(name: str) -> QuotaKey:
    limit_id, period, starts_on = name.split(":")
    return QuotaKey(int(limit_id), period, date.fromisoformat(starts_on))


def _record(key: QuotaKey, actual: int) -> None:
    """Add what settled to a quota's database counter (made if it is the first)."""
    if not statements.quota_record(key, tokens=actual):
        _counter(key)
        statements.quota_record(key, tokens=actual)


def _charge(quota: Quota, tokens: int, now: datetime) -> int:
    """The database store: charge a quota's counter or refuse; one UPDATE when its id is
    known."""
    room = quota.maximum - tokens
    known = _counter_ids.get(quota.key)
    # The key is checked too: a row of a rolled-back transaction may have left its id here.
    if known is not None and statements.quota_charge(
        known, tokens=tokens, room=room, key=quota.key
    ):
        return known
    counter = _counter(quota.key)
    if not statements.quota_charge(counter.pk, tokens=tokens, room=room):
        counter.refresh_from_db(fields=["used"])
        _refuse(quota.refusal(counter.used, now))
    return counter.pk


def _counter(key: QuotaKey) -> QuotaCounter:
    try:
        with transaction.atomic():
            counter = QuotaCounter.objects.get_or_create(
                limit_id=key.limit_id, period=key.period, starts_on=key.starts_on
            )[0]
    except IntegrityError:
        counter = QuotaCounter.objects.get(
            limit_id=key.limit_id, period=key.period, starts_on=key.starts_on
        )
    if len(_counter_ids) > _COUNTER_IDS_KEPT:
        _counter_ids.clear()
    _counter_ids[key] = counter.pk
    return counter


def period_bounds(period: str, now: datetime, zone: ZoneInfo) -> tuple[date, datetime]:
    """The first day of the period containing ``now`` and when the next one starts."""
    today = now.astimezone(zone).date()
    if period == "day":
        start, following = today, today + timedelta(days=1)
    else:
        start = today.replace(day=1)
        following = (start + timedelta(days=32)).replace(day=1)
    return start, datetime.combine(following, time.min, tzinfo=zone)


def _refuse(refusal: Refusal) -> None:
    metrics.RATE_LIMITED.labels(refusal.code).inc()
    raise RateLimited(
        f"Limit reached ({refusal.code}); retry in {refusal.retry_after} s.",
        code=refusal.code,
        headers=refusal.headers(),
    )


def reservation_record(*, reservation: Reservation) -> None:
    """Write the row of a reservation taken with ``defer_record`` (nothing otherwise, or
    if it is there already): call it off the path to the first token."""
    held = _holds.get(reservation.token)
    if held is None or not held.deferred or held.written:
        return
    statements.reservation_insert(reservation)
    held.written = True


def quota_used(*, key: QuotaKey, now: datetime | None = None) -> int:
    """What a quota counts against its limit: settled plus held, as the store that
    enforces it sees it (Redis when configured and it has the quota, else the database).
    Raises :class:`LimiterUnavailable` if Redis is configured but unreachable."""
    now = now or timezone.now()
    store = limiter()
    if isinstance(store, RedisLimiter):
        used = store.quota_used(key, now)
        if used is not None:
            return used
    counter = QuotaCounter.objects.filter(
        limit_id=key.limit_id, period=key.period, starts_on=key.starts_on
    ).first()
    return counter.used if counter is not None else 0


def budget_extend(*, reservation: Reservation, tokens: int, now: datetime | None = None) -> None:
    """Hold ``tokens`` more on an open reservation, against the same buckets and quota
    counters, all or nothing; raise 429 (the reservation unchanged) if they do not fit.

    A reservation past its expiry cannot grow: its holder is presumed gone, and Redis has
    already dropped its hold, so an extension checked against what is left would let its
    settlement charge the whole reservation past the quota."""
    if tokens <= 0:
        return
    now = now or timezone.now()
    if reservation.expires_at <= now:
        raise InvalidRequest("the reservation has expired")
    if reservation.store == Reservation.Store.REDIS:
        _extend_remote(reservation, tokens, now)
        return
    store = limiter(reservation.store)
    buckets = _buckets(reservation)
    with transaction.atomic():
        counters = QuotaCounter.objects.filter(pk__in=reservation.counters)
        for counter in counters.select_related("limit"):
            key = QuotaKey(counter.limit_id, counter.period, counter.starts_on)
            quota = _quota_of(counter.limit, key, reservation=reservation, now=now)
            if quota is not None and not QuotaCounter.objects.filter(
                pk=counter.pk, used__lte=quota.maximum - tokens
            ).update(used=F("used") + tokens):
                counter.refresh_from_db(fields=["used"])
                _refuse(quota.refusal(counter.used, now))
        moved = Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            tokens=F("tokens") + tokens
        )
        if not moved:
            raise InvalidRequest("the reservation is already settled")
        refusal = store.acquire(
            token=reservation.token, buckets=buckets, slots=[], tokens=tokens, now=now
        )
        if refusal is not None:
            _refuse(refusal)
    reservation.tokens += tokens


def _extend_remote(reservation: Reservation, tokens: int, now: datetime) -> None:
    store = limiter(Reservation.Store.REDIS)
    assert isinstance(store, RedisLimiter)  # noqa: S101 - limiter("redis") is one
    held = _holds.get(reservation.token)
    if held is None:  # taken by another process: read what it holds
        held = _Hold(_buckets(reservation), [], _quotas_of(reservation, now), deferred=False)
    if held.settled:
        raise InvalidRequest("the reservation is already settled")
    extension = _Hold(held.buckets, [], held.quotas, deferred=False)
    refusal = _admit(
        store,
        team=reservation.team,
        token=reservation.token,
        held=extension,
        tokens=tokens,
        now=now,
        expires_at=reservation.expires_at,
    )
    if refusal is not None:
        _refuse(refusal)
    try:
        if held.deferred:  # the row is this object until written
            reservation.tokens += tokens
            if held.written:
                Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
                    tokens=reservation.tokens
                )
            return
        if not Reservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(
            tokens=F("tokens") + tokens
        ):
            raise InvalidRequest("the reservation is already settled")
    except BaseException:
        # The buckets get the tokens back; the quota holds stay as they are until the
        # reservation settles (which drops them whole): never less than what is held.
        with contextlib.suppress(LimiterUnavailable):
            store.release(
                token=uuid.uuid4(), buckets=held.buckets, slots=[], difference=tokens, now=now
            )
        raise
    reservation.tokens += tokens


def _quota_of(
    limit: Limit, key: QuotaKey, *, reservation: Reservation, now: datetime
) -> Quota | None:
    """The quota ``key`` of ``limit`` counts against; None if the limit was lifted."""
    maximum = limit.daily_tokens if key.period == "day" else limit.monthly_tokens
    if maximum is None:
        return None
    _, resets_at = period_bounds(key.period, now, ZoneInfo(reservation.team.time_zone))
    return Quota(key, int(maximum), "key" if limit.api_key_id else "team", resets_at)


def _quotas_of(reservation: Reservation, now: datetime) -> list[Quota]:
    """The quotas a Redis reservation taken by another process charged."""
    keys = _quota_keys(reservation)
    limits = Limit.objects.in_bulk([key.limit_id for key in keys])
    found = [
        _quota_of(limits[key.limit_id], key, reservation=reservation, now=now)
        for key in keys
        if key.limit_id in limits
    ]
    return [quota for quota in found if quota is not None]


def _buckets(reservation: Reservation) -> list[Bucket]:
    found: list[Bucket] = []
    for limit in Limit.objects.filter(pk__in=reservation.buckets):
        bucket, _ = buckets_and_slots(limit)
        if bucket is not None:
            found.append(bucket)
    return found


def _slots(reservation: Reservation) -> list[Slot]:
    # Releasing a slot needs only the limit it belongs to.
    return [Slot(limit_id, 0, "") for limit_id in reservation.slots]


def _quota_keys(reservation: Reservation) -> list[QuotaKey]:
    """The quotas a Redis reservation charged in Redis (by name)."""
    return [_quota_key(name) for name in reservation.counters if isinstance(name, str)]


def budget_settle(*, reservation: Reservation, actual: int, now: datetime | None = None) -> None:
    """Replace the reservation with ``actual`` tokens: refund (or charge) the difference.

    Exactly once: a settled reservation is left alone. Call inside the transaction that
    writes the usage row; outside one, it commits with the settlements of other threads
    (:data:`apps.core.group_commit.budget_writer`). A Redis reservation whose row is not
    written yet is written here first; its Redis refund runs in the same transaction
    (marked pending if Redis is down, for the periodic job to retry).
    """
    budget_writer.run(_settle, reservation, actual, now or timezone.now())


def _settle(reservation: Reservation, actual: int, now: datetime) -> None:
    """Called through the one writer, in a savepoint of its own (all or nothing)."""
    held = _holds.get(reservation.token)
    remote = reservation.store != Reservation.Store.DATABASE
    if held is not None and held.deferred:
        statements.reservation_insert(reservation)
    tokens = statements.reservation_claim(reservation, now=now, actual=actual)
    if tokens is None:
        return
    difference = tokens - actual
    # Counters charged at admission (by id: the database store, and Redis reservations
    # from before Redis counted quotas) give the difference back.
    charged = [c for c in reservation.counters if isinstance(c, int)]
    statements.quota_refund(charged, tokens=difference)
    if not remote:
        limiter("database").release(
            token=reservation.token,
            buckets=held.buckets if held is not None else _buckets(reservation),
            slots=held.slots if held is not None else _slots(reservation),
            difference=difference,
            now=now,
        )
    else:
        # Under the counters' row locks until commit, so the periodic reconciliation
        # sees this settlement in both places or in neither.
        for key in _quota_keys(reservation):
            _record(key, actual)
        if not _release_remote(reservation, held, difference=difference, actual=actual, now=now):
            Reservation.objects.filter(pk=reservation.pk).update(remote_pending=True)
    if held is not None:
        held.settled = True
    metrics.SETTLEMENTS.labels(reservation.kind).inc()


def _release_remote(
    reservation: Reservation, held: _Hold | None, *, difference: int, actual: int, now: datetime
) -> bool:
    """Give a settled reservation's tokens and slot back to Redis and turn its quota holds
    into ``actual``; False if Redis is down. Redis does this once per reservation only."""
    try:
        limiter(Reservation.Store.REDIS).release(
            token=reservation.token,
            buckets=held.buckets if held is not None else _buckets(reservation),
            slots=held.slots if held is not None else _slots(reservation),
            difference=difference,
            now=now,
            quotas=_quota_keys(reservation),
            actual=actual,
        )
    except LimiterUnavailable as exc:
        logger.warning("reservation %s: Redis refund deferred: %s", reservation.pk, exc)
        return False
    return True


def reservations_release_expired(*, now: datetime | None = None) -> int:
    """Release reservations whose holder died before settling (their tokens were never
    used as far as anyone can tell), retry Redis refunds that were deferred, and
    reconcile Redis's quota counters with the database."""
    now = now or timezone.now()
    released = 0
    for reservation in Reservation.objects.filter(settled_at__isnull=True, expires_at__lt=now):
        budget_settle(reservation=reservation, actual=0, now=now)
        released += 1
    for reservation in Reservation.objects.filter(remote_pending=True):
        actual = int(reservation.actual_tokens or 0)
        if not _release_remote(
            reservation,
            None,
            difference=reservation.tokens - actual,
            actual=actual,
            now=reservation.settled_at or now,
        ):
            break  # still down: the next run tries again
        Reservation.objects.filter(pk=reservation.pk).update(remote_pending=False)
    quotas_reconcile(now=now)
    return released


def quotas_reconcile(*, now: datetime | None = None) -> int:
    """Redis's quota counters := the database's record (what settled) plus the holds of
    open reservations, holds past their expiry dropped (a process died before writing
    its reservation, or before settling it). Each counter's row is locked meanwhile, so a
    settlement lands before or after, never half. Returns the counters reconciled."""
    now = now or timezone.now()
    store = limiter()
    if not isinstance(store, RedisLimiter):
        return 0
    today = now.date()
    recent = QuotaCounter.objects.filter(
        Q(period="day", starts_on__gte=today - timedelta(days=1))
        | Q(period="month", starts_on__gte=today - timedelta(days=32))
    )
    done = 0
    for counter_id in recent.values_list("pk", flat=True):
        with transaction.atomic():
            counter = QuotaCounter.objects.select_for_update().get(pk=counter_id)
            key = QuotaKey(counter.limit_id, counter.period, counter.starts_on)
            try:
                store.quota_used(key, now, record=counter.used)
            except LimiterUnavailable as exc:
                logger.warning("quota reconciliation deferred: %s", exc)
                return done
        done += 1
    return done
