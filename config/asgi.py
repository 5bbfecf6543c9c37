"""ASGI entry point: static files, then Django behind a body-size guard (413 before
Django buffers the body)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

django_application = get_asgi_application()

from apps.core.asgi import BodySizeLimit, StaticFiles  # noqa: E402  (needs settings)

application = StaticFiles(BodySizeLimit(django_application))
