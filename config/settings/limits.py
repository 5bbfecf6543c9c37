"""Limits every endpoint enforces before doing expensive work (API.md defaults)."""

from config.env import env

MAX_JSON_BODY_BYTES = env.int("RAGTIER_MAX_JSON_BODY_BYTES", default=1024 * 1024)
MAX_UPLOAD_BYTES = env.int("RAGTIER_MAX_UPLOAD_BYTES", default=25 * 1024 * 1024)
MAX_PDF_PAGES = env.int("RAGTIER_MAX_PDF_PAGES", default=2000)
MAX_DOCUMENT_CHARS = env.int("RAGTIER_MAX_DOCUMENT_CHARS", default=5_000_000)
MAX_CHUNKS_PER_DOCUMENT = env.int("RAGTIER_MAX_CHUNKS_PER_DOCUMENT", default=20_000)
MAX_COLLECTIONS_PER_TEAM = env.int("RAGTIER_MAX_COLLECTIONS_PER_TEAM", default=100)
MAX_QUERY_CHARS = env.int("RAGTIER_MAX_QUERY_CHARS", default=4000)
MAX_TOP_K = env.int("RAGTIER_MAX_TOP_K", default=50)
MAX_PAGE_SIZE = env.int("RAGTIER_MAX_PAGE_SIZE", default=100)

# Django's own guards agree with ours, for the paths that bypass the ASGI limit (tests, WSGI).
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_JSON_BODY_BYTES
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
