from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from apps.chat.services.models import model_registry_status
from apps.core.audit import Actor
from apps.usage.models import Limit, UsageRecord
from apps.usage.services import limit_delete, limit_save


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "team",
        "kind",
        "operation",
        "model",
        "requested_model",
        "upstream",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "status",
    ]
    list_filter = ["kind", "status", "team", "model", "requested_model", "upstream"]
    date_hierarchy = "created_at"
    change_list_template = "admin/usage/usagerecord/change_list.html"

    def get_urls(self) -> list[URLPattern]:
        models = path(
            "models/",
            self.admin_site.admin_view(self.models_view),
            name="usage_usagerecord_models",
        )
        # Before the defaults: their "<path:object_id>/" would swallow "models/".
        return [models, *super().get_urls()]

    def models_view(self, request: HttpRequest) -> TemplateResponse:
        """The model registry, read-only: each alias, and each upstream's circuit state
        and slots in use."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Inference models",
            "models": async_to_sync(model_registry_status)(),
        }
        return TemplateResponse(request, "admin/usage/usagerecord/models.html", context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Limit)
class LimitAdmin(admin.ModelAdmin):
    list_display = [
        "team",
        "api_key",
        "burst_tokens",
        "tokens_per_minute",
        "daily_tokens",
        "monthly_tokens",
        "max_concurrent_streams",
        "max_tokens",
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
