"""The tier's errors, whatever its dialect, reach every surface through the one handler."""

from __future__ import annotations

from apps.core.exceptions import as_application_error
from inference.dialects import upstream_error
from tests.inference.test_upstream_errors import CASES


def test_the_tier_status_is_mapped_through_the_one_handler() -> None:
    for _, status, body, _, api_status in CASES:
        mapped = as_application_error(upstream_error(status, body, {}))
        assert mapped is not None
        assert mapped.status == api_status
    limited = as_application_error(upstream_error(429, "{}", {"retry-after": "120"}))
    assert limited is not None
    assert (limited.type, limited.headers["Retry-After"]) == ("rate_limit_error", "120")
