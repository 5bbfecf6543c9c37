from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from apps.accounts.models import ApiKey, Membership, Team
from apps.accounts.services import api_key_create, api_key_revoke


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "time_zone", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "name",
        "team",
        "user",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["team", "revoked_at"]
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
            team=obj.team, name=obj.name, scopes=obj.scopes or None, user=obj.user
        )
        obj.pk, obj.prefix = issued.api_key.pk, issued.api_key.prefix
        messages.warning(
            request,
            f"The new API key is {issued.secret} — copy it now: it is shown only this once.",
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for api_key in queryset:
            api_key_revoke(api_key=api_key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")
