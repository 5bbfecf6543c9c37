"""NVML: the GPUs' own energy counters (``nvmlDeviceGetTotalEnergyConsumption``, in
millijoules since the driver loaded; Volta and later), summed over every GPU the driver
shows (NVML ignores ``CUDA_VISIBLE_DEVICES``).

``pynvml`` comes from the ``nvidia-ml-py`` package (``pip install nvidia-ml-py``), which
needs the driver's ``libnvidia-ml.so`` at run time; it is imported only when NVML is
chosen, so hosts without a GPU never need it.
"""

from __future__ import annotations

import importlib
from typing import Any

from inference.energy.base import CounterUnreadable

NVML_SOURCE = "nvml"


def nvml_module() -> Any:
    """``pynvml``, or :class:`CounterUnreadable` saying what to install."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise CounterUnreadable("NVML needs the nvidia-ml-py package") from exc


class NvmlCounter:
    """The sum of every GPU's total energy counter. ``nvml``: the ``pynvml`` module (a
    stand-in in tests); typed ``Any`` since the package ships no type hints."""

    name = NVML_SOURCE

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml if nvml is not None else nvml_module()
        try:
            self._nvml.nvmlInit()
            count = int(self._nvml.nvmlDeviceGetCount())
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._nvml.NVMLError as exc:
            raise CounterUnreadable(f"NVML: {exc}") from exc
        if not self._handles:
            raise CounterUnreadable("NVML shows no GPU")

    def read_uj(self) -> int:
        read = self._nvml.nvmlDeviceGetTotalEnergyConsumption
        try:
            millijoules = sum(int(read(handle)) for handle in self._handles)
        except self._nvml.NVMLError as exc:
            raise CounterUnreadable(f"NVML: {exc}") from exc
        return millijoules * 1000
