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

The steps live apart: :mod:`~apps.usage.budgets.reserve`,
:mod:`~apps.usage.budgets.extend` and :mod:`~apps.usage.budgets.settle`, over what a
reservation holds (:mod:`~apps.usage.budgets.holds`) and the database's quota counters
(:mod:`~apps.usage.budgets.counters`). What they read belongs to the read side
(:mod:`apps.usage.limits`, :mod:`apps.usage.periods`, :mod:`apps.usage.selectors`); it is
named here too, for callers that reserve against what they read.
"""

from apps.usage.budgets.extend import budget_extend
from apps.usage.budgets.refusals import AdmissionUnavailable, RateLimited
from apps.usage.budgets.reserve import LIMITER_RETRY_SECONDS, budget_reserve, reservation_record
from apps.usage.budgets.settle import budget_settle, quotas_reconcile, reservations_release_expired
from apps.usage.limits import (
    LimitsCache,
    limits_cache,
    limits_of,
    max_tokens_cap,
    models_permitted,
)
from apps.usage.periods import period_bounds, quota_name
from apps.usage.selectors import quota_used

__all__ = [
    "LIMITER_RETRY_SECONDS",
    "AdmissionUnavailable",
    "LimitsCache",
    "RateLimited",
    "budget_extend",
    "budget_reserve",
    "budget_settle",
    "limits_cache",
    "limits_of",
    "max_tokens_cap",
    "models_permitted",
    "period_bounds",
    "quota_name",
    "quota_used",
    "quotas_reconcile",
    "reservation_record",
    "reservations_release_expired",
]
