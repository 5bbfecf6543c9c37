"""What a store of failed-key buckets answers (one bucket per client address)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeLimit:
    """Each address may fail ``burst`` key lookups at once, then ``per_minute``."""

    burst: int
    per_minute: float


class ProbeBuckets(ABC):
    @abstractmethod
    def take(self, *, address: str, limit: ProbeLimit, cost: int) -> float:
        """Spend ``cost`` (0 or 1) failures of ``address``'s bucket; the seconds until it
        holds a whole failure again when it holds none now (nothing is spent then), else 0.
        ``cost=0`` only asks whether the address may still fail."""
