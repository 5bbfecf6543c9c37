"""Request body limits, shared by the ASGI guard and the Django middleware."""

from django.conf import settings
from django.urls import Resolver404, resolve

MULTIPART_ROUTES = frozenset({"collection-documents"})
"""URL names of the views that take an upload. Django's ASGI handler spools a body to disk
before any view runs, so a multipart body is refused from its headers everywhere else."""


def is_multipart(content_type: str) -> bool:
    return content_type.lower().lstrip().startswith("multipart/")


def body_limit(content_type: str) -> tuple[int, str]:
    """The largest body accepted for ``content_type`` and the error code past it."""
    if is_multipart(content_type):
        # Room for the multipart framing and small fields around one file.
        return settings.MAX_UPLOAD_BYTES + 64 * 1024, "file_too_large"
    return settings.MAX_JSON_BODY_BYTES, "payload_too_large"


def multipart_allowed(content_type: str, path: str) -> bool:
    """False for a ``multipart/*`` body sent to a path whose view takes no upload."""
    if not is_multipart(content_type):
        return True
    try:
        return resolve(path).url_name in MULTIPART_ROUTES
    except Resolver404:
        return False
