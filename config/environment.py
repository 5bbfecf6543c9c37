"""Which settings a process loads when ``DJANGO_SETTINGS_MODULE`` does not say.

``DJANGO_ENV=production`` means the production settings, which refuse to start without
their secrets: an entry point must never fall back to the embedded default's public
``SECRET_KEY`` there. Every entry point (manage.py, ASGI, WSGI, Celery) calls this.
"""

import os

PRODUCTION = "production"


def use_default_settings() -> None:
    production = os.environ.get("DJANGO_ENV", "").strip().lower() == PRODUCTION
    default = "config.settings.production" if production else "config.settings.base"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", default)
