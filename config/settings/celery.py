"""Celery: Redis in production; an on-disk broker for the embedded default.

Tasks acknowledge late and are rejected back to the queue when a worker dies, so a
crash re-delivers instead of losing work; every stage is idempotent to make that safe.
The broker's visibility timeout is longer than the hard time limit, or Redis would hand
a still-running task to a second worker. (The on-disk broker keeps a delivered message
only in the worker's memory: a lost pool child re-delivers it, but a killed worker loses
it, and the stalled sweep re-queues its document.)
"""

from config.env import DATA_DIR, env
from config.settings.redis import REDIS_CONNECT_TIMEOUT, REDIS_SOCKET_TIMEOUT
from config.settings.retrieval import INDEX_COMPACT_SECONDS

REDIS_URL = env.str("REDIS_URL", default="")

# Per task, and so per ingestion stage (the embed stage works in slices well inside them).
# Past the soft limit the stage is interrupted in the worker and the document fails with
# `time_limit_exceeded`; the hard limit catches what ignores the soft one (C code holding
# the interpreter): the pool kills the child process and the delivery counts as lost.
# Both need the prefork pool: the solo pool has no child to interrupt or kill.
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=11 * 60)
CELERY_TASK_SOFT_TIME_LIMIT = env.int(
    "CELERY_TASK_SOFT_TIME_LIMIT", default=max(CELERY_TASK_TIME_LIMIT - 60, 1)
)
# A pool child that has grown past this (KiB) is replaced once its task ends, so one huge
# document's high-water mark is not kept by the worker for every later one.
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env.int("CELERY_WORKER_MAX_MEMORY_MB", default=2048) * 1024
# A hard cap (MiB, 0 = none) on a pool child's data memory, set when the child starts: an
# allocation past it raises MemoryError in the stage, and the document fails with
# `out_of_memory` instead of the kernel's OOM killer taking the worker. Off by default: the
# embedding model, a large collection's index copy and a GPU runtime all count towards it.
WORKER_CHILD_MEMORY_LIMIT_MB = env.int("WORKER_CHILD_MEMORY_LIMIT_MB", default=0)

_broker_dir = DATA_DIR / "broker"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = (
    {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(DATA_DIR / "broker-control"),
        # kombu looks for the next message after this long (default 1 s): one stage per
        # second at most, when a small document's stages take milliseconds.
        "polling_interval": 0.1,
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {
        "visibility_timeout": CELERY_TASK_TIME_LIMIT * 2,
        # Longer than kombu's 1 s BRPOP: a web process enqueueing a task to a hung Redis
        # waits this long, not forever.
        "socket_timeout": REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
    }
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

# Children per worker (Celery's --concurrency): one on the embedded default, each a copy of
# the embedding model.
CELERY_WORKER_CONCURRENCY = env.int("WORKER_CONCURRENCY", default=1)
# Compute threads (torch, OpenMP) per pool child; 0: the cores divided among the children.
WORKER_CHILD_THREADS = env.int("WORKER_CHILD_THREADS", default=0)
# Ingestion is fair across teams: a document waits in its team's line, and the dispatcher
# gives each free place among this many stages with the workers (0: no cap, first come
# first served) to the team with the fewest there, then to the one that has used the
# workers least lately. Keep it at the workers' total concurrency (every worker's children
# together): a stage sent beyond it waits in the broker's queue, first in first out, where
# no other team's stage can overtake it.
INGEST_MAX_IN_FLIGHT = env.int("INGEST_MAX_IN_FLIGHT", default=CELERY_WORKER_CONCURRENCY)
# What a team has used of the workers halves every this many seconds.
INGEST_FAIR_HALF_LIFE_SECONDS = env.float("INGEST_FAIR_HALF_LIFE_SECONDS", default=60.0)
# A document's next stage follows its last at once unless a waiting team has used the
# workers less by more than this (worker seconds): a small document runs through, a team
# far ahead gives way between stages.
INGEST_FAIR_QUANTUM_SECONDS = env.float("INGEST_FAIR_QUANTUM_SECONDS", default=2.0)
# The embed stage hands the worker back after a batch that ends past this, and queues the
# rest behind the other documents' stages: well inside the soft limit, fair to other teams.
INGEST_EMBED_SLICE_SECONDS = env.float(
    "INGEST_EMBED_SLICE_SECONDS", default=min(60.0, CELERY_TASK_SOFT_TIME_LIMIT / 2)
)
# A stage delivered this many times, each of which died with its worker process (a crash,
# the OOM killer, the hard time limit), is not run again: the document is quarantined as
# failed with `worker_crashed`.
DOCUMENT_MAX_LOST_DELIVERIES = env.int("DOCUMENT_MAX_LOST_DELIVERIES", default=3)

# A document whose stage has not moved for this long is re-queued (or failed after
# DOCUMENT_MAX_ATTEMPTS) by the periodic sweep below: past the hard time limit, no stage
# sent to the workers is still running or waiting in the broker behind others.
DOCUMENT_STALL_SECONDS = env.int("DOCUMENT_STALL_SECONDS", default=CELERY_TASK_TIME_LIMIT + 60)
DOCUMENT_MAX_ATTEMPTS = env.int("DOCUMENT_MAX_ATTEMPTS", default=3)

CELERY_BEAT_SCHEDULE = {
    # Index deltas merged into their base where due (after bursts of writes too small to
    # trigger it, or deletes past the tombstone share).
    "indexes-compact": {
        "task": "apps.knowledge.tasks.indexes_compact_task",
        "schedule": INDEX_COMPACT_SECONDS,
    },
    "documents-requeue-stalled": {
        "task": "apps.knowledge.tasks.documents_requeue_stalled_task",
        "schedule": 60.0,
    },
    # Reservations held by a process that died are released, not leaked.
    "reservations-release-expired": {
        "task": "apps.usage.tasks.reservations_release_expired_task",
        "schedule": 60.0,
    },
    # Answers left streaming by a process that died are closed as failed.
    "messages-close-abandoned": {
        "task": "apps.chat.tasks.messages_close_abandoned_task",
        "schedule": 300.0,
    },
    # Each team's retention_days: old conversations, messages, events and Redis buffers.
    "retention-purge": {
        "task": "apps.chat.tasks.retention_purge_task",
        "schedule": 3600.0,
    },
    # Idempotency keys past IDEMPOTENCY_KEY_TTL_SECONDS.
    "idempotency-keys-purge": {
        "task": "apps.core.tasks.idempotency_keys_purge_task",
        "schedule": 3600.0,
    },
}
