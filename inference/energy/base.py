"""What every energy counter is, and what a measurement says.

A counter reads a machine's cumulative energy (RAPL's package counters, NVML's GPU
totals) as a number of microjoules that only grows; :class:`~.meter.EnergyMeter` turns
readings into each answer's share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

JOULES_PER_WH = 3600.0


class CounterUnreadable(Exception):
    """The counter cannot be read now (no such file, no permission, the driver refused):
    the answers it would have measured fall back to the table (``estimated``)."""


class EnergyCounter(Protocol):
    name: str
    """What the ledger row's ``energy_source`` says when this counter measured it."""

    def read_uj(self) -> int:
        """Energy used since some fixed moment, in microjoules, never decreasing (a
        counter's wrap-around is undone here). Raises :class:`CounterUnreadable`."""
        ...


@dataclass(frozen=True)
class Measured:
    """An answer's share of the energy a counter measured while it ran."""

    joules: float
    source: str

    @property
    def wh(self) -> float:
        return self.joules / JOULES_PER_WH
