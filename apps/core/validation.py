from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request


def validated(
    serializer_class: type[serializers.Serializer[Any]], request: Request
) -> dict[str, Any]:
    """The request body validated by ``serializer_class``; a ValidationError becomes a 400
    in the API's error shape (see ``apps.core.exceptions``)."""
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
