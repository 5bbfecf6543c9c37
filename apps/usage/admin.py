from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.accounts.admin import TeamAdmin
from apps.accounts.models import Team
from apps.core.audit import Actor
from apps.usage.models import Limit, UsageRecord
from apps.usage.pages import team_usage_page, usage_days
from apps.usage.services import limit_delete, limit_save


class TeamUsageAdmin(TeamAdmin):
    """The team admin with the team's usage page and a link to it in each row: here, not in
    accounts, which sits below usage and may not import it."""

    list_display = [*TeamAdmin.list_display, "usage"]
    change_form_template = "admin/usage/team/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        usage = path(
            "<path:object_id>/usage/",
            self.admin_site.admin_view(self.usage_view),
            name="accounts_team_usage",
        )
        # Before the defaults: their "<path:object_id>/" would swallow ".../usage/".
        return [usage, *super().get_urls()]

    @admin.display(description="usage")
    def usage(self, obj: Team) -> SafeString:
        return format_html(
            '<a href="{}">usage</a>', reverse("admin:accounts_team_usage", args=[obj.pk])
        )

    def usage_view(self, request: HttpRequest, object_id: str) -> TemplateResponse:
        """Tokens per day by kind over the last ``?days=`` days (30, at most 366), and what
        remains of the team's and its keys' quotas."""
        team = self.get_object(request, unquote(object_id))
        if team is None:
            raise Http404(f"No team with id {object_id!r}.")
        if not self.has_view_permission(request, team):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": team,
            "title": f"Usage of {team}",
            **team_usage_page(team=team, days=usage_days(request.GET.get("days"))),
        }
        return TemplateResponse(request, "admin/usage/team/usage.html", context)


admin.site.unregister(Team)
admin.site.register(Team, TeamUsageAdmin)


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin[UsageRecord]):
    list_display = [
        "created_at",
        "team",
        "kind",
        "operation",
        "model",
        "requested_model",
        "route_reason",
        "upstream",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "energy_wh",
        "energy_source",
        "status",
    ]
    list_filter = [
        "kind",
        "status",
        "team",
        "tag",
        "model",
        "requested_model",
        "route_reason",
        "upstream",
        "energy_source",
    ]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Limit)
class LimitAdmin(admin.ModelAdmin[Limit]):
    list_display = [
        "team",
        "api_key",
        "tag",
        "burst_tokens",
        "tokens_per_minute",
        "daily_tokens",
        "monthly_tokens",
        "daily_usd",
        "monthly_usd",
        "max_concurrent_streams",
        "max_tokens",
        "allowed_models",
        "requests_per_second",
        "request_burst",
    ]
    list_filter = ["team"]
    autocomplete_fields = ["api_key"]

    # Every change goes through the services, so that it lands in the audit log.
    def save_model(
        self, request: HttpRequest, obj: Limit, form: ModelForm[Any], change: bool
    ) -> None:
        limit_save(limit=obj, actor=Actor.of_user(request.user))

    def delete_model(self, request: HttpRequest, obj: Limit) -> None:
        limit_delete(limit=obj, actor=Actor.of_user(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Limit]) -> None:
        for limit in queryset.select_related("team", "api_key"):
            limit_delete(limit=limit, actor=Actor.of_user(request.user))
