from django.contrib import admin
from django.http import HttpRequest

from apps.usage.models import Limit, UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "team",
        "kind",
        "operation",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "status",
    ]
    list_filter = ["kind", "status", "team", "model"]
    date_hierarchy = "created_at"

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
