"""What a caller hears when a budget cannot be reserved or grown."""

from __future__ import annotations

from apps.core.exceptions import ApplicationError
from apps.usage import metrics
from apps.usage.limiters import Refusal


class RateLimited(ApplicationError):
    status, type, code = 429, "rate_limit_error", "team_tokens_per_minute"


class AdmissionUnavailable(ApplicationError):
    """The store that enforces a limit is down: fail closed rather than let requests
    through unchecked."""

    status, type, code = 503, "overloaded", "rate_limiter_unavailable"


def refuse(refusal: Refusal) -> None:
    """Raise 429 for ``refusal``, with the time to retry."""
    metrics.RATE_LIMITED.labels(refusal.code).inc()
    raise RateLimited(
        f"Limit reached ({refusal.code}); retry in {refusal.retry_after} s.",
        code=refusal.code,
        headers=refusal.headers(),
    )
