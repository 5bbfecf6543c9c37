"""The team's usage page: the chart is drawn here, the quota and totals come from the
REST API (static/usage/usage.js)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.accounts.selectors import caller_for
from apps.usage.pages import team_usage_page, usage_days


@login_required
@ensure_csrf_cookie
def usage_page(request: HttpRequest) -> HttpResponse:
    caller = caller_for(user=request.user, api_key=None)
    report = (
        team_usage_page(team=caller.team, days=usage_days(request.GET.get("days")))
        if caller
        else {}
    )
    return render(request, "usage.html", {"page": "usage", "caller": caller, **report})
