"""Settings for the embedded default (``make run``): SQLite, no broker, bundled models.

Every value comes from the environment through ``config.env``; integrations live in
their own modules and are star-imported at the bottom.
"""

import django_stubs_ext

from config.env import BASE_DIR, DATA_DIR, IS_PRODUCTION, env

# Django's generic classes take a type argument at run time as they do in its stubs
# (``admin.ModelAdmin[Team]``), so that mypy can check what an admin holds.
django_stubs_ext.monkeypatch()

# The embedded default's key is public: with DJANGO_ENV=production there is no default.
SECRET_KEY = (
    env.str("DJANGO_SECRET_KEY")
    if IS_PRODUCTION
    else env.str(
        "DJANGO_SECRET_KEY", default="django-insecure-embedded-default-only-never-in-production"
    )
)
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "apps.core",
    "apps.accounts",
    "apps.knowledge",
    "apps.usage",
    "apps.chat",
    "apps.site",
]

MIDDLEWARE = [
    # Django's own, run on the event loop under ASGI (see apps.core.middleware).
    "apps.core.middleware.SecurityMiddleware",
    "apps.core.middleware.ContentSecurityPolicyMiddleware",
    "apps.core.middleware.BodySizeLimitMiddleware",
    "apps.core.middleware.SessionMiddleware",
    "apps.core.middleware.CommonMiddleware",
    "apps.core.middleware.CsrfViewMiddleware",
    "apps.core.middleware.AuthenticationMiddleware",
    "apps.core.middleware.MessageMiddleware",
    "apps.core.middleware.XFrameOptionsMiddleware",
    # Last, as axes asks: turns a locked-out login into 429 (async-capable: no thread hop).
    "axes.middleware.AxesMiddleware",
]

# Django's deploy checks find SecurityMiddleware, CsrfViewMiddleware and
# XFrameOptionsMiddleware by their dotted paths; ours are subclasses run on the event loop,
# so apps.core.checks checks for them instead, and runs the checks that depend on them.
SILENCED_SYSTEM_CHECKS = ["security.W001", "security.W002", "security.W003"]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'ragtier.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the worker write to one file: WAL lets readers run beside a
    # writer, IMMEDIATE takes the write lock up front instead of failing on upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    DATABASES["default"]["CONN_MAX_AGE"] = None  # a file: kept open for good (see below)
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=300))
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
# Connections are kept: a request's sync code runs on a pooled thread (LentThreads in
# apps.core.asgi, DATABASE_THREADS of them kept), so that is one connection per pooled
# thread, not one per request: opening one per request cost a sync endpoint much of its
# throughput and an answer part of its time to first token (see docs/gateway.md). One
# checked at a request's end is checked again at its next use (CONN_HEALTH_CHECKS).
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Async views (the answer streams) run their database work on one shared pool of this
# many threads: each keeps one connection, so this bounds a web process's connections
# from open streams however many there are (apps.core.aio).
DATABASE_THREADS = env.int("DATABASE_THREADS", default=8)

# The web process's cyclic garbage collector (apps.site.warmup): its startup heap (Django,
# torch, the tokenizers) is frozen out of collections, and the young generation is
# collected every this many allocations (CPython's default is 700): at a thousand open
# streams each full collection stops every stream (see docs/gateway.md).
WEB_GC_THRESHOLDS = tuple(env.list("WEB_GC_THRESHOLDS", cast=int, default=[10_000, 50, 100]))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Static assets are served at the ASGI layer (apps.core.asgi.StaticFiles): from
# STATIC_ROOT when collected (production collects into the image, DJANGO_STATIC_ROOT),
# else straight from the installed apps, so the embedded default needs no collectstatic.
STATIC_ROOT = None
MEDIA_ROOT = DATA_DIR / "media"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Headers for every response (SecurityMiddleware, ContentSecurityPolicyMiddleware; the
# ASGI static file server sends the same). Scripts come only from this origin's static
# files: no inline script, no inline handler, no eval; the answer's markdown is
# sanitized before it reaches the page. Inline styles stay allowed (the admin uses them).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
CONTENT_SECURITY_POLICY = env.str(
    "DJANGO_CONTENT_SECURITY_POLICY",
    default="; ".join(
        [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    ),
)

LOGIN_URL = "/login"
LOGOUT_REDIRECT_URL = "/login"
LOGIN_REDIRECT_URL = "/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"httpx": {"level": "WARNING"}, "faiss.loader": {"level": "WARNING"}},
}

from config.settings.api import *  # noqa: E402, F403
from config.settings.celery import *  # noqa: E402, F403
from config.settings.inference import *  # noqa: E402, F403
from config.settings.limits import *  # noqa: E402, F403
from config.settings.login import *  # noqa: E402, F403
from config.settings.monitoring import *  # noqa: E402, F403
from config.settings.protection import *  # noqa: E402, F403
from config.settings.redis import *  # noqa: E402, F403
from config.settings.response_cache import *  # noqa: E402, F403
from config.settings.retrieval import *  # noqa: E402, F403
from config.settings.usage import *  # noqa: E402, F403
