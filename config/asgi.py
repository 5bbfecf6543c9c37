"""ASGI entry point: static files, then Django behind a body-size guard (413 before
Django buffers the body), its sync code on pooled threads. Importing it starts a web
process: the models are loaded and the startup heap frozen before the server listens
(apps.site.warmup)."""

from typing import cast

from django.conf import settings
from django.core import signals
from django.core.asgi import get_asgi_application
from django.db import close_old_connections, reset_queries

from config.environment import use_default_settings

use_default_settings()

django_application = get_asgi_application()

# Served async, a request runs its sync code on a thread lent to it (LentThreads below),
# whose connections were checked when its last request ended (request_finished); these two
# would only cost a thread hop before every request. The shared database pool checks its
# own (apps.core.aio).
signals.request_started.disconnect(close_old_connections)
signals.request_started.disconnect(reset_queries)

from apps.core.asgi import ASGIApp, BodySizeLimit, LentThreads, StaticFiles  # noqa: E402
from apps.site.warmup import web_process_start  # noqa: E402

# django-stubs type the handler's scope as a dict and its send as taking any Mapping; it
# is an ASGI application like any other.
threads = LentThreads(cast(ASGIApp, django_application), idle=settings.DATABASE_THREADS)
application = StaticFiles(BodySizeLimit(threads))
web_process_start()
