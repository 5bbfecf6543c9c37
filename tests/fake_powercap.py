"""A fake Linux powercap folder (``/sys/class/powercap``), laid out as RAPL lays it: one
``intel-rapl:N`` per package, each with ``name``, ``energy_uj`` and
``max_energy_range_uj``, and a sub-domain that must not be counted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RANGE_UJ = 262_143_328_850
"""A real package's ``max_energy_range_uj``."""


@dataclass
class FakePowercap:
    root: Path

    @classmethod
    def make(cls, root: Path, *, packages: int = 1, range_uj: int = RANGE_UJ) -> FakePowercap:
        for number in range(packages):
            cls._domain(root / f"intel-rapl:{number}", f"package-{number}", range_uj)
            cls._domain(root / f"intel-rapl:{number}:0", "core", range_uj)
        return cls(root)

    @staticmethod
    def _domain(folder: Path, name: str, range_uj: int) -> None:
        folder.mkdir(parents=True)
        (folder / "name").write_text(f"{name}\n")
        (folder / "energy_uj").write_text("0\n")
        (folder / "max_energy_range_uj").write_text(f"{range_uj}\n")

    def counter(self, package: int = 0) -> Path:
        return self.root / f"intel-rapl:{package}" / "energy_uj"

    def set(self, microjoules: int, *, package: int = 0) -> None:
        """Written whole at once (as the kernel answers a read), never seen half-written
        by a meter reading it from another thread."""
        path = self.counter(package)
        spare = path.with_name("energy_uj.new")
        spare.write_text(f"{microjoules}\n")
        spare.replace(path)

    def add(self, microjoules: int, *, package: int = 0) -> None:
        """The counter moves on by ``microjoules``, wrapping as RAPL's does."""
        path = self.counter(package)
        range_uj = int((path.parent / "max_energy_range_uj").read_text())
        self.set((int(path.read_text()) + microjoules) % range_uj, package=package)
