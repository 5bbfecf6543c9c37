"""The process's energy meter, as ``ENERGY_SOURCE`` chooses it (:mod:`inference.energy`):
answers begin and end their span on it, and the ledger row takes the share it measured,
else the table's estimate (``energy_source`` says which)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from inference.energy import EnergyMeter, energy_counter


@functools.cache
def energy_meter() -> EnergyMeter:
    """One per process, made at the first answer (NVML is opened then, not at import)."""
    counter = energy_counter(
        settings.ENERGY_SOURCE, powercap_root=Path(settings.ENERGY_POWERCAP_ROOT)
    )
    return EnergyMeter(counter)


@receiver(setting_changed)
def _settings_changed(setting: str, **_: Any) -> None:
    if setting.startswith("ENERGY_"):
        energy_meter.cache_clear()
