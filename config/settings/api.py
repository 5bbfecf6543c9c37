"""Django REST framework and the OpenAPI schema."""

from config.env import env

# API keys are looked up once per process and kept this many seconds: a revocation, scope
# change or deletion made in another process applies everywhere within it (0: no cache).
API_KEY_CACHE_SECONDS = env.float("API_KEY_CACHE_SECONDS", default=5.0)
# Failed key lookups each client address may make at once, then per minute; past them
# 429 rate_limited (apps.accounts.probes). A burst of 0 turns the limit off.
API_KEY_FAILURE_BURST = env.int("API_KEY_FAILURE_BURST", default=20)
API_KEY_FAILURES_PER_MINUTE = env.float("API_KEY_FAILURES_PER_MINUTE", default=10.0)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so that unauthenticated calls answer 401 with WWW-Authenticate: Bearer.
        "apps.accounts.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.HasScope"],
    "DEFAULT_PARSER_CLASSES": [
        # DRF's, with a nesting limit (a deep body would otherwise be a 500).
        "apps.core.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "apps.core.exceptions.api_exception_handler",
    # An answer's form is chosen by Accept (or "stream"), never by ?format=, which would
    # label JSON bodies and errors text/event-stream.
    "URL_FORMAT_OVERRIDE": None,
    # drf-spectacular's, with the error responses every operation shares (apps.core.schema).
    "DEFAULT_SCHEMA_CLASS": "apps.core.schema.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Every authenticated request takes one from its team's request bucket, and one from
    # its view's throttle_scope bucket where it names one (apps.usage.request_rate).
    "DEFAULT_THROTTLE_CLASSES": ["apps.usage.throttling.TeamRequestRate"],
    # Endpoints that cost CPU but no tokens (counting text), per team.
    "DEFAULT_THROTTLE_RATES": {"tokenize": env.str("TOKENIZE_RATE", default="600/minute")},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "ragtier API",
    "DESCRIPTION": (
        "Answers over your own documents. Tokens are the unit of cost, quota and rate "
        'limit. Every error has the shape {"error": {type, code, message, param}}.'
    ),
    "VERSION": "1.0.0",
    # 3.1: JSON Schema's contentMediaType and contentSchema, with which each SSE event's
    # data is declared JSON of its component (apps.core.schema.event_stream).
    "OAS_VERSION": "3.1.0",
    # Fields named ``type`` with different choices (tools, response formats) each get a
    # component of their own name.
    "ENUM_NAME_OVERRIDES": {
        "ToolTypeEnum": ["function"],
        "ResponseFormatTypeEnum": ["text", "json_object", "json_schema"],
    },
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets served from the installed sidecar package, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "APPEND_COMPONENTS": {
        "securitySchemes": {"ApiKey": {"type": "http", "scheme": "bearer"}},
    },
    "SECURITY": [{"ApiKey": []}],
}
