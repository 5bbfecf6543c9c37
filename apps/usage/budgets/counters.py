"""The database's quota counters: charged at admission by the database store, and
recording what settled for both stores."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from apps.usage import statements
from apps.usage.budgets.refusals import refuse
from apps.usage.limiters import Quota, QuotaKey
from apps.usage.models import Limit, QuotaCounter

# Database counter ids by quota, so that charging one is a single UPDATE.
_counter_ids: dict[QuotaKey, int] = {}
_COUNTER_IDS_KEPT = 10_000


def counter_record(key: QuotaKey, actual: int) -> None:
    """Add what settled to a quota's database counter (made if it is the first; nothing if
    its limit was deleted meanwhile: nothing counts against it any more)."""
    if not statements.quota_record(key, tokens=actual):
        if not Limit.objects.filter(pk=key.limit_id).exists():
            return
        _counter(key)
        statements.quota_record(key, tokens=actual)


def counter_charge(quota: Quota, tokens: int, now: datetime) -> int:
    """The database store: charge a quota's counter ``tokens`` (a money budget's:
    nano-dollars) or refuse; one UPDATE when its id is known."""
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
        refuse(quota.refusal(counter.used, now))
    return counter.pk


def _counter(key: QuotaKey) -> QuotaCounter:
    try:
        with transaction.atomic():
            counter = QuotaCounter.objects.get_or_create(
                limit_id=key.limit_id, period=key.period, starts_on=key.starts_on, unit=key.unit
            )[0]
    except IntegrityError:
        counter = QuotaCounter.objects.get(
            limit_id=key.limit_id, period=key.period, starts_on=key.starts_on, unit=key.unit
        )
    if len(_counter_ids) > _COUNTER_IDS_KEPT:
        _counter_ids.clear()
    _counter_ids[key] = counter.pk
    return counter
