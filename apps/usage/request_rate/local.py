"""Request buckets in this process's memory: the embedded default, where there is no Redis.

Each web process then keeps its own buckets, so a team may send the limit to each of
them; the embedded default runs one.
"""

from __future__ import annotations

import threading
from datetime import datetime

from apps.usage.limiters import Refusal, refilled
from apps.usage.request_rate.base import RequestBucket, request_refusal


class LocalRequestLimiter:
    store = "local"

    def __init__(self) -> None:
        # A bucket not here is full. One entry per team (and throttled scope) that called.
        self._levels: dict[str, tuple[int, datetime]] = {}
        self._lock = threading.Lock()

    def take(self, buckets: list[RequestBucket], *, now: datetime) -> Refusal | None:
        with self._lock:
            taken: list[tuple[RequestBucket, int, datetime]] = []
            for bucket in buckets:
                level, at = self._levels.get(bucket.name, (bucket.capacity, now))
                level, at = refilled(level, at, capacity=bucket.capacity, rate=bucket.rate, now=now)
                if level < 1:
                    return request_refusal(bucket, level=level, refilled_at=at, now=now)
                taken.append((bucket, level, at))
            for bucket, level, at in taken:
                self._levels[bucket.name] = (level - 1, at)
            return None

    def clear(self) -> None:
        with self._lock:
            self._levels.clear()
