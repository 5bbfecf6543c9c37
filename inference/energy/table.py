"""The fallback: energy estimated from tokens with a fixed per-model table (Wh per 1000
tokens), used when no counter is chosen or the counter could not be read."""

from __future__ import annotations

ESTIMATED = "estimated"
"""The ledger row's ``energy_source`` when the table gave its energy."""


def energy_estimate(*, tokens: int, wh_per_1k: float) -> float:
    """Wh for ``tokens`` at ``wh_per_1k`` Wh per 1000 tokens."""
    return tokens / 1000 * wh_per_1k
