from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from apps.core.audit import Actor
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_delete, document_delete, document_reingest


class ChunksGoWithTheirOwner(admin.ModelAdmin[Any]):
    """For an admin whose deletes take chunks with them: chunks may not be deleted alone
    (see :class:`ChunkAdmin`), which would otherwise refuse the whole delete page."""

    def get_deleted_objects(
        self, objs: Sequence[Model] | QuerySet[Any], request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(str(Chunk._meta.verbose_name))
        return deleted, counts, perms_needed, protected


@admin.register(Collection)
class CollectionAdmin(ChunksGoWithTheirOwner):
    list_display = ["name", "team", "index_backend", "index_base", "index_version", "created_at"]
    list_filter = ["team"]
    search_fields = ["name", "team__name"]
    readonly_fields = ["index_backend", "index_base", "index_version", "created_at"]

    # Deletes go through the services, as the API's do: the index folder and uploaded
    # files go, the team's cached answers are dropped, and the audit log says who.
    def delete_model(self, request: HttpRequest, obj: Collection) -> None:
        collection_delete(collection=obj, actor=Actor.of_user(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Collection]) -> None:
        for collection in queryset.select_related("team"):
            collection_delete(collection=collection, actor=Actor.of_user(request.user))


@admin.register(Document)
class DocumentAdmin(ChunksGoWithTheirOwner):
    list_display = [
        "title",
        "collection",
        "team",
        "status",
        "progress",
        "chunk_count",
        "embedding_tokens",
        "updated_at",
    ]
    list_filter = ["status", "media_type", "team"]
    search_fields = ["title", "filename", "content_hash"]
    date_hierarchy = "created_at"
    readonly_fields = [
        "team",
        "collection",
        "filename",
        "media_type",
        "source",
        "size_bytes",
        "content_hash",
        "status",
        "stage",
        "progress",
        "attempts",
        "page_count",
        "chunk_count",
        "embedding_tokens",
        "reservation",
        "error",
        "created_at",
        "updated_at",
        "indexed_at",
    ]
    actions = ["reingest"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # documents arrive through the API or `manage.py ingest`

    # As the API's delete: vectors tombstoned (the index version moves, so cached answers
    # quoting it miss), the ingestion hold settled, the file removed, the deletion audited.
    def delete_model(self, request: HttpRequest, obj: Document) -> None:
        document_delete(document=obj, actor=Actor.of_user(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        for document in queryset:
            document_delete(document=document, actor=Actor.of_user(request.user))

    @admin.action(description="Re-ingest selected documents")
    def reingest(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        for document in queryset:
            document_reingest(document=document)
        self.message_user(request, f"Queued {queryset.count()} document(s) for re-ingestion.")


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin[Chunk]):
    list_display = ["id", "document", "index", "token_count"]
    list_filter = ["collection"]
    search_fields = ["text"]
    readonly_fields = ("document", "collection", "index", "headings", "token_count", "text")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a chunk goes with its document (document_delete), never alone
