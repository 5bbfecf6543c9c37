"""The Celery app; configuration lives in Django settings under the CELERY_ namespace."""

from celery import Celery
from celery.signals import worker_process_init

from config.environment import use_default_settings

use_default_settings()

app = Celery("ragtier")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _make_broker_folders(sender: Celery, **_: object) -> None:
    """The embedded on-disk broker needs its folders before the first message."""
    from pathlib import Path

    options = sender.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "control_folder"):
        if key in options:
            Path(options[key]).mkdir(parents=True, exist_ok=True)


@worker_process_init.connect
def _cap_child_memory(**_: object) -> None:
    """Hold each pool child to ``WORKER_CHILD_MEMORY_LIMIT_MB`` of data memory.

    ``worker_max_memory_per_child`` replaces a child only after its task; this cap stops
    the task itself: an allocation past it raises MemoryError inside the stage, which
    fails the document with ``out_of_memory``, where the kernel's OOM killer would take
    the process (and re-deliver the document to take the next one).
    """
    import resource

    from django.conf import settings

    limit_mb = settings.WORKER_CHILD_MEMORY_LIMIT_MB
    if limit_mb > 0:
        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


@worker_process_init.connect
def _share_the_cores(**_: object) -> None:
    """Give each pool child ``WORKER_CHILD_THREADS`` compute threads (torch, OpenMP):
    by default the cores divided among the children, so that two children embedding at
    once do not each start a thread per core and slow each other down."""
    import os
    import sys

    from django.conf import settings

    threads = settings.WORKER_CHILD_THREADS or max(
        1, len(os.sched_getaffinity(0)) // max(settings.CELERY_WORKER_CONCURRENCY, 1)
    )
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read when torch or FAISS first loads
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
