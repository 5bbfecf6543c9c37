from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import document_reingest


@admin.register(Collection)
class CollectionAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "index_base", "index_version", "created_at"]
    list_filter = ["team"]
    search_fields = ["name", "team__name"]
    readonly_fields = ["index_base", "index_version", "created_at"]


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
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

    @admin.action(description="Re-ingest selected documents")
    def reingest(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        for document in queryset:
            document_reingest(document=document)
        self.message_user(request, f"Queued {queryset.count()} document(s) for re-ingestion.")


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    list_display = ["id", "document", "index", "token_count"]
    list_filter = ["collection"]
    search_fields = ["text"]
    fields = ["document", "collection", "index", "headings", "token_count", "text"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
