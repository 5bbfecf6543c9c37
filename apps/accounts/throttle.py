"""Login throttling with django-axes: what a lockout answers, and what a success clears.

Settings in ``config.settings.login``.
"""

from __future__ import annotations

import math
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.http import HttpRequest, JsonResponse

from apps.core.audit import admin_login_failure_record
from apps.core.exceptions import error_body


class LoginAttemptHandler(AxesDatabaseHandler):
    """Axes' database handler, but a successful login clears only the failures recorded
    against its own username, and a failed admin login goes to the audit log.

    Axes clears every attempt matching any lockout parameter, so with ``ip_address``
    among them a login to an account of one's own would also clear every failure from
    that IP, against every username: guess four passwords, log in as yourself, repeat.
    """

    def user_login_failed(
        self,
        sender: Any,
        credentials: dict[str, Any],
        request: HttpRequest | None = None,
        **kwargs: Any,
    ) -> None:
        """Axes' count, then the audit record, except for a login that axes refused, its
        username or address being locked out already: a locked-out client's retries would
        write to the log without bound, while the failures before the lockout are few."""
        refused = request is not None and self.is_locked(request, credentials)
        super().user_login_failed(sender, credentials, request, **kwargs)
        if not refused:
            admin_login_failure_record(
                request=request,
                credentials=credentials,
                locked_out=bool(getattr(request, "axes_locked_out", False)),
            )

    def reset_user_attempts(
        self, request: HttpRequest, credentials: dict[str, Any] | None = None
    ) -> int:
        username = get_client_username(request, credentials)
        if not username:
            return 0
        count, _ = AccessAttempt.objects.filter(username=username).delete()
        return count


def lockout_response(request: HttpRequest, *args: Any) -> JsonResponse:
    """``AXES_LOCKOUT_CALLABLE``: 429 in the API's error shape, with ``Retry-After``.

    Axes calls it as ``(request, original_response, credentials)``, or, from its
    middleware's async path, ``(request, credentials)``: neither is needed here.
    """
    cool_off = get_cool_off(request)
    response = JsonResponse(
        error_body(
            type="rate_limit_error",
            code="too_many_login_attempts",
            message="Too many failed logins for this account or address; try again later.",
        ),
        status=429,
    )
    if cool_off:
        response["Retry-After"] = str(max(1, math.ceil(cool_off.total_seconds())))
    return response
