"""Production: PostgreSQL, Redis, secrets from the environment with no defaults.

Start-up fails with one message naming every missing setting, rather than one at a time.
"""

import base64
import binascii

from django.core.exceptions import ImproperlyConfigured

from config.env import BASE_DIR, env

_REQUIRED = (
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_ALLOWED_HOSTS",
    # Stored prompts, answers and uploads are encrypted with these (no key file here).
    "RAGTIER_ENCRYPTION_KEYS",
)


def _fernet_key(key: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(key.strip().encode("ascii"))) == 32
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False


_missing = [name for name in _REQUIRED if not env.str(name, default="")]
if _missing:
    raise ImproperlyConfigured(
        "Production settings need these environment variables: " + ", ".join(_missing)
    )

from config.settings.base import *  # noqa: E402, F403
from config.settings.protection import ENCRYPTION_KEYS  # noqa: E402

_invalid = [number for number, key in enumerate(ENCRYPTION_KEYS, 1) if not _fernet_key(key)]
if _invalid:
    raise ImproperlyConfigured(
        "RAGTIER_ENCRYPTION_KEYS must be Fernet keys (32 url-safe base64 bytes); these are "
        "not: " + ", ".join(f"key {number}" for number in _invalid)
    )

DEBUG = False
SECRET_KEY = env.str("DJANGO_SECRET_KEY")
# Closed unless METRICS_TOKEN or METRICS_ALLOWED_NETWORKS opens them (config.settings.monitoring).
METRICS_OPEN_BY_DEFAULT = False

# HTTPS only. A TLS-terminating proxy in front (deploy/nginx.conf) says so with
# DJANGO_BEHIND_TLS_PROXY: only then is its X-Forwarded-Proto believed, since a client
# reaching the app directly could send that header itself.
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
# Probes inside the network speak plain HTTP to the app itself.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=True)
if not SECURE_HSTS_PRELOAD:
    # Turned off on purpose (preload is hard to undo): not a warning then.
    SILENCED_SYSTEM_CHECKS = [*SILENCED_SYSTEM_CHECKS, "security.W021"]
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
STATIC_ROOT = env.path("DJANGO_STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
}
