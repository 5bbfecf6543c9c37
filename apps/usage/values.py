"""The usage block of one generation, as a value."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

UsageSource = Literal["upstream", "counted"]


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
)
