from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inference.energy import (
    CounterUnreadable,
    EnergyMeter,
    NvmlCounter,
    RaplCounter,
    energy_counter,
    wrapped_delta,
)
from tests.fake_powercap import FakePowercap

J = 1_000_000  # microjoules


@pytest.fixture
def powercap(tmp_path: Path) -> FakePowercap:
    return FakePowercap.make(tmp_path / "powercap")


def unreadable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """``path`` refuses to be read, as ``energy_uj`` does to non-root users since Linux
    5.10 (the suite runs as root, which a mode of 000 would not stop)."""
    read_text = Path.read_text

    def refuse(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == path:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)


def test_rapl_sums_the_packages_and_skips_their_sub_domains(tmp_path: Path) -> None:
    powercap = FakePowercap.make(tmp_path, packages=2)
    psys = tmp_path / "intel-rapl:2"  # the whole platform: it holds the packages' energy
    psys.mkdir()
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("0\n")
    counter = RaplCounter(tmp_path)
    assert counter.read_uj() == 0  # the first reading is the baseline
    powercap.add(3 * J, package=0)
    powercap.add(5 * J, package=1)
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text(f"{99 * J}\n")
    (psys / "energy_uj").write_text(f"{99 * J}\n")
    assert counter.read_uj() == 8 * J


def test_rapl_undoes_the_counters_wrap_around(tmp_path: Path) -> None:
    powercap = FakePowercap.make(tmp_path, range_uj=100 * J)
    powercap.set(97 * J)
    counter = RaplCounter(tmp_path)
    counter.read_uj()
    powercap.add(5 * J)  # 97 J + 5 J wraps past 100 J to 2 J
    assert int(powercap.counter().read_text()) == 2 * J
    assert counter.read_uj() == 5 * J
    powercap.add(1 * J)
    assert counter.read_uj() == 6 * J
    assert wrapped_delta(10, 30, range_uj=100) == 20
    assert wrapped_delta(90, 5, range_uj=100) == 15


def test_a_powercap_root_without_packages_is_no_counter(tmp_path: Path) -> None:
    with pytest.raises(CounterUnreadable, match="no RAPL package domain"):
        RaplCounter(tmp_path)
    assert energy_counter("rapl", powercap_root=tmp_path) is None  # the table


def test_one_answer_gets_what_the_counter_moved(powercap: FakePowercap) -> None:
    meter = EnergyMeter(RaplCounter(powercap.root))
    powercap.add(40 * J)  # before it: nobody's
    span = meter.begin()
    powercap.add(36 * J)
    measured = meter.end(span)
    assert measured is not None and measured.source == "rapl"
    assert measured.joules == 36 and measured.wh == pytest.approx(0.01)
    powercap.add(7 * J)  # idle
    second = meter.begin()
    powercap.add(18 * J)
    assert meter.end(second) == type(measured)(joules=18, source="rapl")
    assert meter.end(second) is None  # a span ends once


def test_two_overlapping_answers_split_the_joules_by_their_time_share(
    powercap: FakePowercap,
) -> None:
    """A steady 2 W: A runs from 0 s to 10 s, B from 5 s to 15 s. Each was at the tier
    10 s of the 15 s the counter moved 30 J in, so each gets 15 J: A 10 J alone, then
    half of the 10 J they shared; B the other half, then 10 J alone."""
    meter = EnergyMeter(RaplCounter(powercap.root))
    watts = 2
    a = meter.begin()
    powercap.add(5 * watts * J)
    b = meter.begin()
    powercap.add(5 * watts * J)
    a_share = meter.end(a)
    powercap.add(5 * watts * J)
    b_share = meter.end(b)
    assert a_share is not None and b_share is not None
    assert (a_share.joules, b_share.joules) == (15, 15)


def test_overlapping_answers_of_unequal_length_share_every_joule(
    powercap: FakePowercap,
) -> None:
    """A long answer with two short ones inside it, the second starting as the first
    ends: every joule moved while any ran is attributed once, each stretch split among
    the answers running in it."""
    meter = EnergyMeter(RaplCounter(powercap.root))
    long = meter.begin()
    powercap.add(12 * J)  # long alone
    first = meter.begin()
    powercap.add(8 * J)  # long and first
    second = meter.begin()
    powercap.add(9 * J)  # all three
    first_share = meter.end(first)
    powercap.add(4 * J)  # long and second
    second_share = meter.end(second)
    powercap.add(1 * J)  # long alone
    long_share = meter.end(long)
    shares = [s.joules if s else None for s in (long_share, first_share, second_share)]
    assert shares == [pytest.approx(12 + 4 + 3 + 2 + 1), pytest.approx(4 + 3), 3 + 2]
    assert sum(s or 0 for s in shares) == pytest.approx(34)


def test_an_unreadable_counter_leaves_the_answers_running_across_it_estimated(
    powercap: FakePowercap, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    meter = EnergyMeter(RaplCounter(powercap.root))
    across = meter.begin()
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING):
        unreadable(patch, powercap.counter())
        started_blind = meter.begin()  # its first reading fails: no baseline
    powercap.add(5 * J)  # while the counter was last seen unreadable: nobody's
    assert "Permission denied" in caplog.text
    after = meter.begin()
    powercap.add(6 * J)
    assert meter.end(across) is None
    assert meter.end(started_blind) is None
    measured = meter.end(after)  # began once the counter could be read again
    # Its stretch had three answers running (the other two unmeasured): a third of 6 J.
    assert measured is not None and measured.joules == pytest.approx(2)


def test_an_unreadable_counter_at_start_means_the_table(
    powercap: FakePowercap, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unreadable(monkeypatch, powercap.counter())
    with caplog.at_level(logging.WARNING):
        assert energy_counter("rapl", powercap_root=powercap.root) is None
    assert "using the table" in caplog.text
    meter = EnergyMeter(None)
    assert meter.begin() is None and meter.end(None) is None


class FakeNvml(SimpleNamespace):  # its methods have pynvml's names
    """``pynvml`` as far as the counter uses it: energy in millijoules per GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, *millijoules: int) -> None:
        super().__init__(energy=list(millijoules), broken=False)

    def nvmlInit(self) -> None:
        if self.broken:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.energy)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if self.broken:
            raise self.NVMLError("GPU is lost")
        return self.energy[handle]


def test_nvml_sums_every_gpus_millijoules() -> None:
    nvml = FakeNvml(1_000, 2_500)
    counter = NvmlCounter(nvml)
    meter = EnergyMeter(counter)
    span = meter.begin()
    nvml.energy = [41_000, 12_500]
    measured = meter.end(span)
    assert measured is not None and measured.source == "nvml" and measured.joules == 50
    nvml.broken = True
    with pytest.raises(CounterUnreadable, match="GPU is lost"):
        counter.read_uj()
    with pytest.raises(CounterUnreadable, match="Driver Not Loaded"):
        NvmlCounter(nvml)


def test_auto_takes_nvml_where_a_gpu_is_seen_else_rapl_else_the_table(
    powercap: FakePowercap, tmp_path: Path
) -> None:
    with_gpu = energy_counter("auto", powercap_root=powercap.root, nvml=FakeNvml(5))
    assert isinstance(with_gpu, NvmlCounter)
    no_gpu = energy_counter("auto", powercap_root=powercap.root, nvml=FakeNvml())
    assert isinstance(no_gpu, RaplCounter)
    assert energy_counter("auto", powercap_root=tmp_path / "none", nvml=FakeNvml()) is None
    assert energy_counter("table", powercap_root=powercap.root, nvml=FakeNvml(5)) is None
    with pytest.raises(ValueError, match="ENERGY_SOURCE"):
        energy_counter("watts", powercap_root=powercap.root)
