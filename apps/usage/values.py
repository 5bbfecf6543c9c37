"""The usage block of one generation, and a team's or key's limits, as values."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from decimal import Decimal
from typing import Any, Literal

UsageSource = Literal["upstream", "counted"]
NANOS_PER_USD = 1_000_000_000


def nanos_of(usd: Decimal) -> int:
    """A cost in whole nano-dollars, rounded up: what money budgets count (a reservation's
    worst case and the actual cost are rounded alike, so one never falls below the
    other)."""
    return math.ceil(usd * NANOS_PER_USD)


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What one generation used. ``prompt_tokens`` includes ``cached_tokens``;
    ``completion_tokens`` includes ``reasoning_tokens`` (never add subsets to totals)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    ttft_ms: int | None = None
    duration_ms: int = 0
    tokens_per_second: float | None = None
    queue_ms: int = 0
    model: str = ""
    source: UsageSource = "counted"
    cache_hit: bool = False
    context_window: int | None = None
    """The served model's window: ``prompt_tokens`` over it is how full the answer ran."""
    dropped_passages: int = 0
    """Passages the search found that the window left out (lowest-ranked first)."""
    dropped_turns: int = 0
    """History messages the window left out (oldest first)."""
    summarized_turns: int = 0
    """History messages replaced by a summary (``HISTORY_POLICY=summarize``)."""
    dropped_tokens: int = 0
    """The tokens the passages and turns left out or summarised would have taken, each
    counted on its own with the serving model's tokenizer."""
    tag: str = ""
    """The purpose tag the usage is charged under."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_tokens": self.total_tokens}

    def columns(self) -> dict[str, Any]:
        """The fields the ledger and a message both store."""
        return {name: getattr(self, name) for name in USAGE_COLUMNS}


USAGE_COLUMNS = (
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "ttft_ms",
    "duration_ms",
    "tokens_per_second",
    "queue_ms",
    "cache_hit",
)


@dataclass(frozen=True, kw_only=True)
class LimitValues:
    """The limits of a team or key, as ``Limit`` stores them; None: unlimited (for
    ``allowed_models``: any model)."""

    burst_tokens: int | None = None
    tokens_per_minute: int | None = None
    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    daily_usd: Decimal | None = None
    monthly_usd: Decimal | None = None
    max_concurrent_streams: int | None = None
    max_tokens: int | None = None
    allowed_models: list[str] | None = None

    @classmethod
    def of(cls, limit: object) -> LimitValues:
        """The values of a ``Limit`` row (or anything with its fields)."""
        return cls(**{field.name: getattr(limit, field.name) for field in fields(cls)})

    def recorded(self) -> dict[str, Any]:
        """As the audit log keeps them (JSON: money as strings)."""
        return {
            name: str(value) if isinstance(value, Decimal) else value
            for name, value in asdict(self).items()
        }
