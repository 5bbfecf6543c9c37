from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.accounts.models import ApiKey, Membership, Team
from apps.accounts.services import api_key_create, api_key_revoke, api_key_validate
from apps.core.audit import Actor
from apps.core.exceptions import ApplicationError
from apps.usage.pages import team_usage_page, usage_days


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "time_zone", "queue_weight", "retention_days", "created_at", "usage"]
    search_fields = ["name"]
    inlines = [MembershipInline]
    change_form_template = "admin/accounts/team/change_form.html"

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
        return TemplateResponse(request, "admin/accounts/team/usage.html", context)


class ApiKeyForm(forms.ModelForm):
    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.instance.pk is None and data.get("team") is not None:
            try:
                api_key_validate(
                    team=data["team"], user=data.get("user"), expires_at=data.get("expires_at")
                )
            except ApplicationError as exc:
                raise forms.ValidationError({exc.param or NON_FIELD_ERRORS: exc.message}) from exc
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = [
        "prefix",
        "name",
        "team",
        "user",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
        "expires_at",
    ]
    list_filter = ["team", "revoked_at", "expires_at"]
    search_fields = ["prefix", "name", "team__name"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]
    fields = [
        "team",
        "user",
        "name",
        "scopes",
        "prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
        "expires_at",
    ]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        # A key's owner and scopes are fixed once issued; revoke and re-issue instead.
        return [*self.readonly_fields, "team", "user", "scopes"] if obj else self.readonly_fields

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: ModelForm[Any], change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        issued = api_key_create(
            team=obj.team,
            name=obj.name,
            scopes=obj.scopes or None,
            user=obj.user,
            expires_at=obj.expires_at,
            actor=Actor.of_user(request.user),
        )
        obj.pk, obj.prefix = issued.api_key.pk, issued.api_key.prefix
        messages.warning(
            request,
            f"The new API key is {issued.secret} — copy it now: it is shown only this once.",
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for api_key in queryset:
            api_key_revoke(api_key=api_key, actor=Actor.of_user(request.user))
        self.message_user(request, f"Revoked {queryset.count()} key(s).")
