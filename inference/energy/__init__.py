"""Energy measured where it can be: RAPL's CPU package counters, NVML's GPU counters, or
a per-model table as the fallback, and a meter that shares what a counter measured among
the answers by their time at the tier (:mod:`.meter`).

Nothing here imports Django; the ledger (``apps.usage``) chooses and keeps the meter.
"""

from inference.energy.base import CounterUnreadable, EnergyCounter, Measured
from inference.energy.choose import AUTO, SOURCES, TABLE, energy_counter
from inference.energy.meter import EnergyMeter, Span
from inference.energy.nvml import NVML_SOURCE, NvmlCounter
from inference.energy.rapl import DEFAULT_POWERCAP_ROOT, RAPL_SOURCE, RaplCounter, wrapped_delta
from inference.energy.table import ESTIMATED, energy_estimate

__all__ = [
    "AUTO",
    "DEFAULT_POWERCAP_ROOT",
    "ESTIMATED",
    "NVML_SOURCE",
    "RAPL_SOURCE",
    "SOURCES",
    "TABLE",
    "CounterUnreadable",
    "EnergyCounter",
    "EnergyMeter",
    "Measured",
    "NvmlCounter",
    "RaplCounter",
    "Span",
    "energy_counter",
    "energy_estimate",
    "wrapped_delta",
]
