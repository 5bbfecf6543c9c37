"""One permission class: the caller has a team and the scope the view names."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions
from rest_framework.request import Request

from apps.accounts.selectors import Caller, caller_for


class HasScope(permissions.BasePermission):
    """Views map HTTP methods to a scope: ``required_scopes = {"GET": "read"}``.

    A method the view does not name needs no scope (a public view names none).
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        scope: str | None = getattr(view, "required_scopes", {}).get(request.method)
        if scope is None:
            return True
        caller = caller_for(user=request.user, api_key=request.auth)
        if caller is None:
            if request.auth is None and not request.user.is_authenticated:
                raise exceptions.NotAuthenticated()
            raise exceptions.PermissionDenied("You belong to no team.", code="no_team")
        if not caller.can(scope):
            raise exceptions.PermissionDenied(
                f"This API key lacks the {scope!r} scope.", code="scope_missing"
            )
        request.caller = caller  # type: ignore[attr-defined]
        return True


def get_caller(request: Request) -> Caller:
    caller: Caller = request.caller  # type: ignore[attr-defined]
    return caller
