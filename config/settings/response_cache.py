"""The response cache: exact-match answers to single-turn questions (apps.chat.response_cache).

``RESPONSE_CACHE_TTL`` seconds (0 turns it off); entries never outlive a team's retention.
Stored in Redis when a URL is set (``RESPONSE_CACHE_REDIS_URL``, else ``REDIS_URL``), else
in the database; encrypted at rest either way.
"""

from config.env import env

RESPONSE_CACHE_TTL = env.int("RESPONSE_CACHE_TTL", default=3600)
RESPONSE_CACHE_REDIS_URL = env.str(
    "RESPONSE_CACHE_REDIS_URL", default=env.str("REDIS_URL", default="")
)
RESPONSE_CACHE_KEY_PREFIX = env.str("RESPONSE_CACHE_KEY_PREFIX", default="ragtier:rcache:")
