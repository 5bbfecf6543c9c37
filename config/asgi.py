"""ASGI entry point: static files, then Django behind a body-size guard (413 before
Django buffers the body). Importing it starts a web process: the models are loaded and
the startup heap frozen before the server listens (apps.site.warmup)."""

from django.core import signals
from django.core.asgi import get_asgi_application
from django.db import close_old_connections, reset_queries

from config.environment import use_default_settings

use_default_settings()

django_application = get_asgi_application()

# Served async, each request runs its sync code in a thread made for that request, which
# holds no connection when the request starts; these two would only cost a thread hop
# before every request. That thread still closes its connections when the request ends
# (request_finished), and the shared database pool checks its own (apps.core.aio).
signals.request_started.disconnect(close_old_connections)
signals.request_started.disconnect(reset_queries)

from apps.core.asgi import BodySizeLimit, StaticFiles  # noqa: E402  (needs settings)
from apps.site.warmup import web_process_start  # noqa: E402

application = StaticFiles(BodySizeLimit(django_application))
web_process_start()
