"""A fair, capacity-bounded queue in front of each inference upstream.

Two implementations share one contract (:class:`~inference.scheduling.queue.Scheduler`):

- :class:`LocalScheduler` (:mod:`~inference.scheduling.local`) keeps the queue in the
  process (asyncio), for the embedded default of a single web process.
- :class:`RedisScheduler` (:mod:`~inference.scheduling.redis`) keeps it in Redis, shared
  by every web process: slots are leases that expire unless renewed, so a crashed
  process gives its slots back by itself.

A request granted at once costs nothing extra: no task switch locally, one Lua call in
Redis.
"""

from inference.scheduling.local import LocalScheduler
from inference.scheduling.queue import FairQueue, Lease, Scheduler
from inference.scheduling.redis import RedisScheduler

__all__ = ["FairQueue", "Lease", "LocalScheduler", "RedisScheduler", "Scheduler"]
