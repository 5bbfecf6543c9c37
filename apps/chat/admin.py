from __future__ import annotations

from asgiref.sync import async_to_sync
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from apps.chat.services.models import model_registry_status
from apps.usage.admin import UsageRecordAdmin
from apps.usage.models import UsageRecord


class UsageRecordModelsAdmin(UsageRecordAdmin):
    """The usage records' admin with the model registry's page beside them (where an admin
    reading usage by model looks): here, not in usage, which sits below chat and may not
    import it."""

    change_list_template = "admin/chat/usagerecord/change_list.html"

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
        return TemplateResponse(request, "admin/chat/usagerecord/models.html", context)


admin.site.unregister(UsageRecord)
admin.site.register(UsageRecord, UsageRecordModelsAdmin)
