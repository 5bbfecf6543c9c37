"""Request body limits, shared by the ASGI guard and the Django middleware."""

from django.conf import settings


def body_limit(content_type: str) -> tuple[int, str]:
    """The largest body accepted for ``content_type`` and the error code past it."""
    if content_type.lower().startswith("multipart/"):
        # Room for the multipart framing and small fields around one file.
        return settings.MAX_UPLOAD_BYTES + 64 * 1024, "file_too_large"
    return settings.MAX_JSON_BODY_BYTES, "payload_too_large"
