from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from apps.core.exceptions import InvalidRequest

# At most 18 ASCII digits: within a database's 64-bit integers. ``str.isdigit`` alone
# passes other scripts' digits, some of which ``int`` then refuses (superscripts): a 500.
MAX_OFFSET = 10**18 - 1


def _ascii_integer(raw: str) -> bool:
    return 0 < len(raw) <= 18 and raw.isascii() and raw.isdigit()


class Pagination(LimitOffsetPagination):
    """``?limit=&offset=``; asking for more than the page-size cap is an error, not a clamp."""

    default_limit = 20

    @property
    def max_limit(self) -> int:  # type: ignore[override]
        return int(settings.MAX_PAGE_SIZE)

    def get_limit(self, request: Request) -> int | None:
        raw = request.query_params.get(self.limit_query_param)
        if raw is not None:
            if not _ascii_integer(raw) or int(raw) < 1:
                raise InvalidRequest(
                    "limit must be a positive integer.", code="invalid_value", param="limit"
                )
            if int(raw) > self.max_limit:
                raise InvalidRequest(
                    f"limit may be at most {self.max_limit}.",
                    code="page_size_too_large",
                    param="limit",
                )
        return super().get_limit(request)

    def get_offset(self, request: Request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is not None and not _ascii_integer(raw):
            raise InvalidRequest(
                "offset must be a non-negative integer.", code="invalid_value", param="offset"
            )
        return super().get_offset(request)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """DRF's ``limit`` and ``offset``, with the bounds enforced above."""
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters
