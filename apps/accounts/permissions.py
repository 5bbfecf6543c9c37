"""One permission class: the caller has a team and the scope the view names; and the role
checks of destructive actions, which views make once they hold the object."""

from __future__ import annotations

from typing import Any, cast

from rest_framework import exceptions, permissions
from rest_framework.request import Request

from apps.accounts.models import ApiKey
from apps.accounts.selectors import TEAM_MANAGER_ROLES, Caller, caller_for, caller_role
from apps.core.exceptions import PermissionDenied


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
        # ApiKeyAuthentication's key, or None (a session); DRF's stubs assume its Token.
        api_key = cast("ApiKey | None", request.auth)
        caller = caller_for(user=request.user, api_key=api_key)
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


def role_require_manager(*, caller: Caller, action: str) -> None:
    """403 ``role_forbidden`` unless the caller is an owner or admin of its team (a key of
    no user acts as a member). ``action`` completes "Only the team's owners and admins …"."""
    if caller_role(caller=caller) not in TEAM_MANAGER_ROLES:
        raise PermissionDenied(
            f"Only the team's owners and admins {action}.", code="role_forbidden"
        )


def role_require_own_or_manager(
    *, caller: Caller, user_id: int | None, api_key_id: int | None, action: str
) -> None:
    """Owners and admins act on anything of the team; a member only on what they made: a
    user on what they made signed in or with any of their keys (``user_id``), a key of no
    user on what it made itself (``api_key_id``). Else 403 ``role_forbidden``."""
    if caller.user is not None and user_id is not None and user_id == caller.user.pk:
        return
    own_key = caller.api_key
    if caller.user is None and own_key is not None and api_key_id == own_key.pk:
        return
    role_require_manager(caller=caller, action=action)


def get_caller(request: Request) -> Caller:
    caller: Caller = request.caller  # type: ignore[attr-defined]
    return caller
