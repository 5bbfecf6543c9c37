"""The browser page: a small, server-rendered chat over the team's collections."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.accounts.selectors import caller_for
from apps.knowledge.selectors import collection_list


@login_required
@ensure_csrf_cookie
def chat_page(request: HttpRequest) -> HttpResponse:
    caller = caller_for(user=request.user, api_key=None)
    collections = list(collection_list(team=caller.team)) if caller else []
    return render(request, "chat.html", {"caller": caller, "collections": collections})
