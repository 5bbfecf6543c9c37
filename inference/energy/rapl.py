"""RAPL through Linux's powercap files: the CPU packages' energy counters.

Each package domain is a folder ``intel-rapl:N`` under the powercap root (AMD's CPUs use
the same names) with ``name`` (``package-N``), ``energy_uj`` (a counter in microjoules
that wraps at ``max_energy_range_uj``) and more. Sub-domains (``intel-rapl:N:M``: cores,
DRAM) lie inside their package's figure and a ``psys`` domain covers the whole platform,
so only the packages are summed. Since Linux 5.10 ``energy_uj`` is readable by root only
unless the operator grants it (a udev rule, or ``chmod``); unreadable, it is
:class:`~.base.CounterUnreadable` and the answers fall back to the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inference.energy.base import CounterUnreadable

RAPL_SOURCE = "rapl"
DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise CounterUnreadable(f"cannot read {path}: {exc}") from exc


def wrapped_delta(before: int, now: int, *, range_uj: int) -> int:
    """Microjoules between two readings of a counter that wraps to 0 past ``range_uj``
    (one wrap at most between readings: at 200 W the usual 262 kJ range takes 22
    minutes to go round, and the meter reads at every answer's start and end)."""
    return now - before if now >= before else range_uj - before + now


@dataclass
class _Domain:
    folder: Path
    range_uj: int
    last: int | None = None
    total: int = 0

    def advance(self) -> int:
        now = _read_int(self.folder / "energy_uj")
        if self.last is not None:
            self.total += wrapped_delta(self.last, now, range_uj=self.range_uj)
        self.last = now
        return self.total


def package_domains(root: Path) -> list[Path]:
    """The package domains under ``root`` (``intel-rapl:N`` named ``package-*``)."""
    domains = []
    for folder in sorted(root.glob("intel-rapl:*")):
        if folder.name.count(":") != 1:
            continue  # a sub-domain, inside its package's figure
        try:
            name = (folder / "name").read_text().strip()
        except OSError:
            continue
        if name.startswith("package"):
            domains.append(folder)
    return domains


class RaplCounter:
    """The sum of the package counters under ``root``, wraps undone."""

    name = RAPL_SOURCE

    def __init__(self, root: Path = DEFAULT_POWERCAP_ROOT) -> None:
        folders = package_domains(root)
        if not folders:
            raise CounterUnreadable(f"no RAPL package domain under {root}")
        self._domains = [
            _Domain(folder, range_uj=_read_int(folder / "max_energy_range_uj"))
            for folder in folders
        ]

    def read_uj(self) -> int:
        return sum(domain.advance() for domain in self._domains)
