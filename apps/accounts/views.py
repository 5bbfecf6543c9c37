"""The API keys page: the list, issue and revoke go through /api/v1/keys (keys.js)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.accounts.models import Scope
from apps.accounts.selectors import KeyManager, caller_for, key_manager_for
from apps.core.exceptions import PermissionDenied


@login_required
@ensure_csrf_cookie
def keys_page(request: HttpRequest) -> HttpResponse:
    caller = caller_for(user=request.user, api_key=None)
    manager: KeyManager | None = None
    refusal = ""
    if caller is not None:
        try:
            manager = key_manager_for(caller=caller)
        except PermissionDenied as exc:
            refusal = exc.message
    scopes = [
        {"value": scope, "grantable": manager is not None and scope in manager.grantable}
        for scope in Scope.values
    ]
    context = {"page": "keys", "caller": caller, "manager": manager, "refusal": refusal}
    return render(request, "keys.html", {**context, "scopes": scopes})
