"""Each answer's share of the energy a counter measured, by its share of tier time.

The process keeps one :class:`EnergyMeter`. An answer calls :meth:`~EnergyMeter.begin`
when its request leaves for the tier and :meth:`~EnergyMeter.end` when it is over, and the
meter reads the counter at each of those moments. Between two readings the set of answers
generating does not change, so the joules the counter moved in between go in equal parts
to the answers running then (none running: to nobody): each answer gets, from every
stretch of time, the share its presence there earns, which is the split by share of tier
time. Two answers that overlap for half of one of them share that half and each keeps its
own time alone.

The meter keeps this as one running figure, the joules each running answer has earned
since the meter was last idle (the "busy integral"), so an answer's share is that figure
at its end less the figure at its start, whatever else began and ended meanwhile. For
answers one after another it is exactly the counter's movement over each.

A reading that fails (:class:`~.base.CounterUnreadable`) leaves every answer running
across it unmeasured (``end`` returns None: the table estimates it, and the row says
``estimated``); the next reading that works starts afresh.

What it does not know: a counter measures the whole machine (the idle draw while an answer
ran is in its share), and one process's meter sees only its own answers, so several
processes answering at once on one machine would each count the same joules.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass

from inference.energy.base import CounterUnreadable, EnergyCounter, Measured

logger = logging.getLogger(__name__)
MICROJOULES = 1_000_000


@dataclass(frozen=True)
class Span:
    """An answer's time at the tier as the meter saw it begin."""

    number: int
    mark: float
    """The busy integral (joules) at its start."""
    faults: int | None
    """Failed readings before its start; None: the reading at its start failed too (no
    baseline)."""


class EnergyMeter:
    """The process's one meter over ``counter`` (None: nothing is measured)."""

    def __init__(self, counter: EnergyCounter | None) -> None:
        self.counter = counter
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._running: set[int] = set()
        self._last: int | None = None
        """The counter's last good reading (µJ); None after a failed one."""
        self._earned = 0.0
        self._faults = 0

    def begin(self) -> Span | None:
        """An answer's request leaves for the tier now; None when nothing is measured."""
        if self.counter is None:
            return None
        with self._lock:
            self._advance()
            number = next(self._numbers)
            self._running.add(number)
            faults = self._faults if self._last is not None else None
            return Span(number=number, mark=self._earned, faults=faults)

    def end(self, span: Span | None) -> Measured | None:
        """That answer is over: its share, or None (nothing measured, a reading failed
        while it ran, or the span ended already)."""
        if span is None or self.counter is None:
            return None
        with self._lock:
            if span.number not in self._running:
                return None
            self._advance()
            self._running.discard(span.number)
            earned = self._earned - span.mark
            if not self._running:
                self._earned = 0.0  # idle: marks restart from 0, so the figure stays small
            if self._faults != span.faults:
                return None
            return Measured(joules=earned, source=self.counter.name)

    def _advance(self) -> None:
        """Read the counter and share what it moved among the answers running."""
        assert self.counter is not None  # noqa: S101 - begin and end return first
        try:
            now = self.counter.read_uj()
        except CounterUnreadable as exc:
            if self._last is not None or self._faults == 0:
                logger.warning("energy counter %s unreadable: %s", self.counter.name, exc)
            self._faults += 1
            self._last = None
            return
        if self._last is not None and self._running:
            self._earned += (now - self._last) / MICROJOULES / len(self._running)
        self._last = now
