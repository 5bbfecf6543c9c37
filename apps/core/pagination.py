from __future__ import annotations

from django.conf import settings
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from apps.core.exceptions import InvalidRequest


class Pagination(LimitOffsetPagination):
    """``?limit=&offset=``; asking for more than the page-size cap is an error, not a clamp."""

    default_limit = 20

    @property
    def max_limit(self) -> int:  # type: ignore[override]
        return int(settings.MAX_PAGE_SIZE)

    def get_limit(self, request: Request) -> int | None:
        raw = request.query_params.get(self.limit_query_param)
        if raw is not None:
            if not raw.isdigit() or int(raw) < 1:
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
