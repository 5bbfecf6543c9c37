"""Who may read ``/metrics`` and ``/readyz``.

A request is let in when it carries ``Authorization: Bearer <METRICS_TOKEN>`` or comes from
a network in ``METRICS_ALLOWED_NETWORKS`` (comma-separated CIDRs, e.g.
``10.0.0.0/8,127.0.0.1/32``; behind a proxy the address is the one the ASGI server takes
from ``X-Forwarded-For``). With neither set they are open on the embedded default and
closed (403) when ``DJANGO_ENV=production``.
"""

from config.env import IS_PRODUCTION, env

METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=[])
METRICS_OPEN_BY_DEFAULT = not IS_PRODUCTION
# /readyz gives the inference tier this long to list its models.
READINESS_INFERENCE_TIMEOUT = env.float("READINESS_INFERENCE_TIMEOUT", default=3.0)
