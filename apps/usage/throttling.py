"""The request-rate check as a DRF throttle: it runs right after authentication and the
scope check (DRF's ``initial``), before the view parses a body or does any work.

A default throttle class (``DEFAULT_THROTTLE_CLASSES``), so every API view has it; public
views (no caller) are not limited. See :mod:`apps.usage.request_rate`.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle


class TeamRequestRate(BaseThrottle):
    """One request from the caller's team's buckets, or 429 ``rate_limited`` (raised: its
    headers say exactly when to come back). The async views await :meth:`aallow_request`
    instead (:class:`apps.core.aio.AsyncApiView`)."""

    def allow_request(self, request: Request, view: Any) -> bool:
        # Here, not at the top: DRF imports this class while apps.core.aio (which the
        # buckets use) is still importing APIView.
        from apps.usage.request_rate import request_admit

        caller = getattr(request, "caller", None)
        if caller is not None:
            request_admit(team=caller.team, scope=getattr(view, "throttle_scope", None))
        return True

    async def aallow_request(self, request: Request, view: Any) -> bool:
        from apps.usage.request_rate import request_aadmit

        caller = getattr(request, "caller", None)
        if caller is not None:
            await request_aadmit(team=caller.team, scope=getattr(view, "throttle_scope", None))
        return True
