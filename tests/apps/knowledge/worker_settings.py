"""Settings for the Celery worker processes that the real-process tests start.

The test settings, plus what only these workers need: a broker visibility timeout the
test chooses (how soon a killed worker's message is handed out again) and the fault
hooks of :mod:`tests.apps.knowledge.sabotage`, imported by the worker at start.
"""

from config.env import env
from config.settings.test import *  # noqa: F403

CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
    "visibility_timeout": env.int("TEST_BROKER_VISIBILITY_TIMEOUT", default=3600),
    # Look for such messages every second, not every 100 s (10 s x a throttle of 10).
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
CELERY_IMPORTS = ["tests.apps.knowledge.sabotage"]
