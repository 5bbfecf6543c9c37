"""Celery: Redis in production; an on-disk broker for the embedded default.

Tasks acknowledge late and are rejected back to the queue when a worker dies, so a
crash re-delivers instead of losing work; every stage is idempotent to make that safe.
The broker's visibility timeout is longer than the hard time limit, or Redis would hand
a still-running task to a second worker.
"""

from config.env import DATA_DIR, env

REDIS_URL = env.str("REDIS_URL", default="")

CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=30 * 60)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 60

_broker_dir = DATA_DIR / "broker"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = (
    {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(DATA_DIR / "broker-control"),
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {"visibility_timeout": CELERY_TASK_TIME_LIMIT * 2}
)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

# A document whose stage has not moved for this long is re-queued (or failed after
# DOCUMENT_MAX_ATTEMPTS) by the periodic sweep below.
DOCUMENT_STALL_SECONDS = env.int("DOCUMENT_STALL_SECONDS", default=CELERY_TASK_TIME_LIMIT + 60)
DOCUMENT_MAX_ATTEMPTS = env.int("DOCUMENT_MAX_ATTEMPTS", default=3)

CELERY_BEAT_SCHEDULE = {
    "documents-requeue-stalled": {
        "task": "apps.knowledge.tasks.documents_requeue_stalled_task",
        "schedule": 60.0,
    },
    # Reservations held by a process that died are released, not leaked.
    "reservations-release-expired": {
        "task": "apps.usage.tasks.reservations_release_expired_task",
        "schedule": 60.0,
    },
}
