"""Failed-key buckets in this process: the embedded default (no Redis), and the fallback
while Redis is unreachable. Each process counts its own failures."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from apps.accounts.probes.base import ProbeBuckets, ProbeLimit


class LocalProbeBuckets(ProbeBuckets):
    """At most ``max_addresses`` buckets, the least recently used dropped first, so that
    many addresses cannot grow the process without bound."""

    def __init__(
        self, *, max_addresses: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_addresses = max_addresses
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, *, address: str, limit: ProbeLimit, cost: int) -> float:
        now = self.clock()
        with self._lock:
            tokens, since = self._buckets.get(address, (float(limit.burst), now))
            tokens = min(float(limit.burst), tokens + (now - since) * limit.per_minute / 60)
            if tokens < 1:
                return (1 - tokens) * 60 / limit.per_minute
            if cost:
                self._buckets[address] = (tokens - cost, now)
                self._buckets.move_to_end(address)
                while len(self._buckets) > self.max_addresses:
                    self._buckets.popitem(last=False)
            return 0.0

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()
