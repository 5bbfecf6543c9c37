"""Which counter measures the answers: ``ENERGY_SOURCE`` read as a choice."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from inference.energy.base import CounterUnreadable, EnergyCounter
from inference.energy.nvml import NVML_SOURCE, NvmlCounter
from inference.energy.rapl import RAPL_SOURCE, RaplCounter

logger = logging.getLogger(__name__)
AUTO = "auto"
TABLE = "table"
SOURCES = (AUTO, TABLE, NVML_SOURCE, RAPL_SOURCE)


def energy_counter(source: str, *, powercap_root: Path, nvml: Any = None) -> EnergyCounter | None:
    """The counter ``source`` names (None: the table). ``auto``: NVML where a GPU is
    seen, else RAPL where a package counter can be read, else the table. A counter named
    but not there (no GPU, no permission) falls back to the table with a warning: the
    ledger rows say ``estimated``."""
    if source not in SOURCES:
        raise ValueError(f"ENERGY_SOURCE must be one of {', '.join(SOURCES)}, not {source!r}")
    if source == TABLE:
        return None
    tries = [NVML_SOURCE, RAPL_SOURCE] if source == AUTO else [source]
    for name in tries:
        try:
            return _opened(name, powercap_root=powercap_root, nvml=nvml)
        except CounterUnreadable as exc:
            level = logging.INFO if source == AUTO else logging.WARNING
            logger.log(level, "energy from %s not available: %s; using the table", name, exc)
    return None


def _opened(name: str, *, powercap_root: Path, nvml: Any) -> EnergyCounter:
    """The counter, read once (a counter that cannot be read now is no choice)."""
    counter: EnergyCounter = (
        NvmlCounter(nvml) if name == NVML_SOURCE else RaplCounter(powercap_root)
    )
    counter.read_uj()
    return counter
