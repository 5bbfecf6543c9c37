from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.request import Request

from apps.core.exceptions import InvalidRequest

# The largest id a database holds (a signed 64-bit integer); a larger one in a list of
# ids is a 400 here, not an overflow in the database driver.
MAX_ID = 2**63 - 1


def validated(
    serializer_class: type[serializers.Serializer[Any]], request: Request
) -> dict[str, Any]:
    """The request body validated by ``serializer_class``; a ValidationError becomes a 400
    in the API's error shape (see ``apps.core.exceptions``)."""
    serializer = serializer_class(data=request.data)
    serializer.__dict__["fields"] = _fields(serializer_class)  # DRF's cached property, set
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


_built = threading.local()


def _fields(serializer_class: type[serializers.Serializer[Any]]) -> Any:
    """The bound fields of ``serializer_class``, built once per thread. DRF deep-copies a
    serializer's declared fields for every instance (nested serializers each theirs):
    most of validating a request body, on the path to the first token (docs/gateway.md).
    Validating
    neither changes a field nor yields, so the one thread that uses them at a time may
    reuse them; they stay bound to a first, empty instance (no context: the serializers
    validated here read none)."""
    built: dict[type[serializers.Serializer[Any]], Any] = _built.__dict__.setdefault("by", {})
    if serializer_class not in built:
        built[serializer_class] = serializer_class().fields
    return built[serializer_class]


def message_length_check(content: object, *, param: str) -> None:
    """A message longer than ``MAX_MESSAGE_CHARS`` fits no configured context window:
    ``400 context_length_exceeded`` from its length alone, before it is tokenized."""
    limit = settings.MAX_MESSAGE_CHARS
    if isinstance(content, str) and len(content) > limit:
        raise InvalidRequest(
            f"{param} has {len(content)} characters; the largest context window here holds "
            f"at most {limit}.",
            code="context_length_exceeded",
            param=param,
        )


def chat_messages_check(messages: object, *, param: str = "messages") -> None:
    """More than ``MAX_CHAT_MESSAGES`` messages: ``400 too_many_messages``; then each
    message's length (:func:`message_length_check`). Cheap, so it runs before any
    message is validated or counted."""
    if not isinstance(messages, list):
        return  # the serializer says what is wrong with it
    limit = settings.MAX_CHAT_MESSAGES
    if len(messages) > limit:
        raise InvalidRequest(
            f"{param} has {len(messages)} messages; at most {limit} are accepted.",
            code="too_many_messages",
            param=param,
        )
    for index, message in enumerate(messages):
        if isinstance(message, dict):
            message_length_check(message.get("content"), param=f"{param}.{index}.content")
