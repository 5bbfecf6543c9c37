from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from apps.accounts.models import Team
from apps.chat.services.teams import PurgeReport, team_purge
from apps.chat.services.tier import model_registry_status
from apps.core.audit import Actor
from apps.knowledge.admin import ChunksGoWithTheirOwner
from apps.usage.admin import TeamUsageAdmin, UsageRecordAdmin
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


class TeamPurgeAdmin(ChunksGoWithTheirOwner, TeamUsageAdmin):
    """The team admin whose delete is :func:`team_purge`: index folders, uploaded files,
    cached answers and Redis keys go with the rows, answers running are stopped first, and
    the audit log says what went. Here, in the highest app that holds a team's data."""

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Not in one transaction, as Django's is: team_purge commits step by step, so that a
        # process streaming one of the team's answers sees its stop request (and settles)
        # before the conversation goes, as the bulk delete action already does.
        # Django's private _delete_view is not in its stubs.
        view: Callable[..., HttpResponse] = self._delete_view  # type: ignore[attr-defined]
        return view(request, object_id, extra_context)

    def delete_model(self, request: HttpRequest, obj: Team) -> None:
        self._report(request, team_purge(team=obj, actor=Actor.of_user(request.user)), obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Team]) -> None:
        for team in queryset:
            self._report(request, team_purge(team=team, actor=Actor.of_user(request.user)), team)

    def _report(self, request: HttpRequest, report: PurgeReport, team: Team) -> None:
        self.message_user(
            request,
            f"{team.name}: {report.conversations} conversations, {report.messages} messages, "
            f"{report.collections} collections, {report.documents} documents, "
            f"{report.index_folders} index folders, {report.files} files, "
            f"{report.cached_answers} cached answers, {report.keys} keys revoked, "
            f"{report.limiter_keys} limiter keys removed.",
            messages.INFO,
        )


admin.site.unregister(Team)
admin.site.register(Team, TeamPurgeAdmin)
