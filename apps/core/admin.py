from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.core.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin[AuditEvent]):
    """Read-only: an audit log that its readers could edit would prove nothing."""

    list_display = ["created_at", "action", "actor", "team_name", "target"]
    list_filter = ["action", "team"]
    search_fields = ["actor", "target", "team_name"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
