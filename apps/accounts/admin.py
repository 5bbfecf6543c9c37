from __future__ import annotations

import weakref
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import NON_FIELD_ERRORS
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from apps.accounts.models import ApiKey, Membership, Scope, Team
from apps.accounts.services import (
    api_key_create,
    api_key_delete,
    api_key_expiry_validate,
    api_key_revoke,
    api_key_update,
    api_key_validate,
)
from apps.core.audit import Actor
from apps.core.exceptions import ApplicationError


class MembershipInline(admin.TabularInline[Membership, Team]):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin[Team]):
    list_display = ["name", "time_zone", "queue_weight", "retention_days", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]
    # apps/usage/admin.py extends this with the team's usage page.


class ApiKeyForm(forms.ModelForm[ApiKey]):
    # Checkboxes, at least one: an empty JSON list must not stand for every scope.
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="what the key may do: keys lets it issue and revoke keys",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            if self.instance.pk is None and data.get("team") is not None:
                api_key_validate(
                    team=data["team"], user=data.get("user"), expires_at=data.get("expires_at")
                )
            elif self.instance.pk is not None and "expires_at" in self.changed_data:
                api_key_expiry_validate(expires_at=data.get("expires_at"))
        except ApplicationError as exc:
            raise forms.ValidationError({exc.param or NON_FIELD_ERRORS: exc.message}) from exc
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
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
    # Revocation goes through the "revoke" action, so that it is audited (and never undone).
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A new key's secret, from save_model to response_add of the same request.
        self._secrets: weakref.WeakKeyDictionary[HttpRequest, str] = weakref.WeakKeyDictionary()

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        # A key's owner and scopes are fixed once issued; revoke and re-issue instead.
        return [*self.readonly_fields, "team", "user", "scopes"] if obj else self.readonly_fields

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: ModelForm[Any], change: bool
    ) -> None:
        if change:
            api_key_update(
                api_key=obj,
                name=obj.name,
                expires_at=obj.expires_at,
                actor=Actor.of_user(request.user),
            )
            return
        issued = api_key_create(
            team=obj.team,
            name=obj.name,
            scopes=list(obj.scopes),
            user=obj.user,
            expires_at=obj.expires_at,
            actor=Actor.of_user(request.user),
        )
        obj.pk, obj.prefix = issued.api_key.pk, issued.api_key.prefix
        obj.scopes, obj.created_at = issued.api_key.scopes, issued.api_key.created_at
        self._secrets[request] = issued.secret

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The new key's secret, on a page of its own, once: never in a message, which
        would carry it in the messages cookie to the next page."""
        secret = self._secrets.pop(request, None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "New API key",
            "api_key": obj,
            "secret": secret,
        }
        # Admin views are never_cache: the page is not stored either.
        return TemplateResponse(request, "admin/accounts/apikey/issued.html", context)

    # A delete revokes first (its children too) and is audited, as the API's revoke is.
    def delete_model(self, request: HttpRequest, obj: ApiKey) -> None:
        api_key_delete(api_key=obj, actor=Actor.of_user(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for api_key in queryset.select_related("team"):
            api_key_delete(api_key=api_key, actor=Actor.of_user(request.user))

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for api_key in queryset:
            api_key_revoke(api_key=api_key, actor=Actor.of_user(request.user))
        self.message_user(request, f"Revoked {queryset.count()} key(s).")
