"""ASGI entry point: Django behind a body-size guard that answers 413 before buffering."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

django_application = get_asgi_application()

from apps.core.asgi import BodySizeLimit  # noqa: E402  (needs configured settings)

application = BodySizeLimit(django_application)
