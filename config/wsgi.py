"""WSGI entry point, for tools that want one; the product is served over ASGI."""

from django.core.wsgi import get_wsgi_application

from config.environment import use_default_settings

use_default_settings()

application = get_wsgi_application()
