"""Test settings: fast fakes by default; integration tests switch to the real parts.

The database is PostgreSQL when DATABASE_URL says so (CI), SQLite otherwise; both pass.
"""

import tempfile
from pathlib import Path

from config.env import env
from config.settings.base import *  # noqa: F403
from config.settings.base import DATABASES

DATA_DIR = Path(env.str("RAGTIER_TEST_DATA_DIR", default="") or tempfile.mkdtemp(prefix="ragtier-"))
INDEX_DIR = DATA_DIR / "indexes"
# Nodes that each keep a data dir of their own still share the uploads (the worker reads
# what a web node stored): the real-process tests of the engine backend set this.
MEDIA_ROOT = Path(env.str("RAGTIER_TEST_MEDIA_ROOT", default="") or DATA_DIR / "media")

EMBEDDER_BACKEND = env.str("EMBEDDER_BACKEND", default="retrieval.embedders.FakeEmbedder")
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=True)
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="memory://")
CELERY_BROKER_TRANSPORT_OPTIONS = {}

# The fake tier returns logprobs; the real tier's tests start one that does (or set this).
INFERENCE_UNSUPPORTED = []
# The fake tier serves any number of streams at once; queue tests set their own limit.
INFERENCE_MAX_CONCURRENCY = env.int("INFERENCE_MAX_CONCURRENCY", default=64)

# Off unless a test turns it on: many tests ask one question twice and expect the tier to
# answer both times (tests/apps/chat/test_response_cache.py turns it on).
RESPONSE_CACHE_TTL = env.int("RESPONSE_CACHE_TTL", default=0)

# The table, whatever the machine's counters: a test of measured energy points
# ENERGY_POWERCAP_ROOT at a fake powercap folder and sets "rapl".
ENERGY_SOURCE = env.str("ENERGY_SOURCE", default="table")

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# One fixed key for the whole suite, so that the worker and server processes a test starts
# (each with its own data dir) read what the test wrote; key files are tested on their own.
ENCRYPTION_KEYS = env.list(
    "RAGTIER_ENCRYPTION_KEYS", default=["dGVzdC1vbmx5LWtleS1mb3ItdGhlLXN1aXRlLTAwMDA="]
)

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory, so that a real worker process can share the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
