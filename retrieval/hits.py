"""What every index answers with: a chunk id and its score (higher is better)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Hit:
    id: int
    score: float
