"""One permission class: the caller has a team and the scope the view names."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions, throttling
from rest_framework.request import Request
from rest_framework.settings import api_settings

from apps.accounts.selectors import Caller, caller_for


class HasScope(permissions.BasePermission):
    """Views map HTTP methods to a scope: ``required_scopes = {"GET": "read"}``.

    A view that names no scope is public. On one that names any, every method needs a
    caller: HEAD and OPTIONS (which Django and DRF answer without the view naming them)
    need what GET needs, or, on a view without GET, any one of the view's scopes; any
    other method it does not name needs only a caller (the view then answers 405).
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        required: dict[str, str] = getattr(view, "required_scopes", {})
        if not required:
            return True
        scopes = _scopes_for(required, request.method or "")
        caller = caller_for(user=request.user, api_key=request.auth)
        if caller is None:
            if request.auth is None and not request.user.is_authenticated:
                raise exceptions.NotAuthenticated()
            raise exceptions.PermissionDenied("You belong to no team.", code="no_team")
        if scopes and not any(caller.can(scope) for scope in scopes):
            raise exceptions.PermissionDenied(
                f"This API key lacks the {scopes[0]!r} scope.", code="scope_missing"
            )
        request.caller = caller  # type: ignore[attr-defined]
        return True


def _scopes_for(required: dict[str, str], method: str) -> list[str]:
    """The scopes of which the caller needs one for ``method``; empty: only a caller."""
    if method in required:
        return [required[method]]
    if method in ("HEAD", "OPTIONS"):
        return [required["GET"]] if "GET" in required else sorted(set(required.values()))
    return []


class TeamRateThrottle(throttling.ScopedRateThrottle):
    """DRF's scoped throttle (the view's ``throttle_scope`` names the rate), counted per
    team rather than per user, for endpoints whose cost is CPU, not tokens; kept in the
    Django cache of each process."""

    def get_rate(self) -> str | None:
        rate: str | None = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        return rate  # read now, not at import, so that a settings change applies

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        caller = getattr(request, "caller", None)
        if caller is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": caller.team.pk}


def get_caller(request: Request) -> Caller:
    caller: Caller = request.caller  # type: ignore[attr-defined]
    return caller
