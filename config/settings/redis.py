"""Timeouts for every Redis client (queue, answer journal, Celery's broker).

A Redis that stops answering must cost a request seconds, not hang it: connect fails fast,
and no single command may wait longer than the socket timeout. The rate limiter has its
own, shorter one (``RATE_LIMIT_REDIS_TIMEOUT``), since it sits on every admission.
"""

from config.env import env

REDIS_CONNECT_TIMEOUT = env.float("REDIS_CONNECT_TIMEOUT", default=2.0)
REDIS_SOCKET_TIMEOUT = env.float("REDIS_SOCKET_TIMEOUT", default=5.0)
