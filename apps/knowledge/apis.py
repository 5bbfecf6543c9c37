"""HTTP for collections, documents and search: parse → one call → render."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import (
    get_caller,
    role_require_manager,
    role_require_own_or_manager,
)
from apps.core.idempotency import (
    REPLAYED_HEADER,
    idempotency_complete,
    idempotency_guard,
    idempotency_request_claim,
)
from apps.core.models import IdempotencyKey
from apps.core.pagination import Pagination
from apps.core.parsers import JSONParser
from apps.core.schema import IDEMPOTENCY_RESPONSES, idempotency_key_parameter
from apps.core.validation import MAX_ID, validated
from apps.knowledge import selectors, services
from apps.knowledge.models import Collection, Document


class CollectionOutput(serializers.ModelSerializer[Collection]):
    document_count = serializers.SerializerMethodField()

    class Meta:
        model = Collection
        fields = ["id", "name", "description", "document_count", "created_at"]

    def get_document_count(self, collection: Collection) -> int:
        # Annotated by the selectors; a collection fresh from create has none yet.
        return int(getattr(collection, "document_count", 0))


class DocumentOutput(serializers.ModelSerializer[Document]):
    class Meta:
        model = Document
        fields = [
            "id",
            "collection_id",
            "title",
            "filename",
            "media_type",
            "size_bytes",
            "status",
            "progress",
            "chunk_count",
            "page_count",
            "embedding_tokens",
            "error",
            "created_at",
            "updated_at",
            "indexed_at",
        ]


class CollectionListCreateApi(APIView):
    required_scopes = {"GET": "read", "POST": "ingest"}
    pagination_class = Pagination

    class InputSerializer(serializers.Serializer[dict[str, str]]):
        name = serializers.CharField(max_length=200)
        description = serializers.CharField(
            max_length=2000, required=False, default="", allow_blank=True
        )

    @extend_schema(responses=CollectionOutput(many=True))
    def get(self, request: Request) -> Response:
        """The caller's team's collections, by name."""
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(
            selectors.collection_list(team=get_caller(request).team), request, view=self
        )
        return paginator.get_paginated_response(CollectionOutput(page, many=True).data)

    @extend_schema(
        request=InputSerializer,
        responses={
            201: CollectionOutput,
            400: OpenApiResponse(description="already_exists: the team has a collection so named"),
        },
    )
    def post(self, request: Request) -> Response:
        """Create a collection: a set of documents with its own vector index."""
        data = validated(self.InputSerializer, request)
        collection = services.collection_create(team=get_caller(request).team, **data)
        return Response(CollectionOutput(collection).data, status=status.HTTP_201_CREATED)


class CollectionDetailApi(APIView):
    required_scopes = {"GET": "read", "DELETE": "ingest"}

    @extend_schema(responses=CollectionOutput)
    def get(self, request: Request, collection_id: int) -> Response:
        """One collection of the caller's team."""
        collection = selectors.collection_get(
            team=get_caller(request).team, collection_id=collection_id
        )
        return Response(CollectionOutput(collection).data)

    @extend_schema(
        responses={
            204: None,
            403: OpenApiResponse(description="role_forbidden: only owners and admins"),
        }
    )
    def delete(self, request: Request, collection_id: int) -> Response:
        """Delete a collection with its documents, chunks and index: owners and admins only
        (a key of no user acts as a member)."""
        caller = get_caller(request)
        collection = selectors.collection_get(team=caller.team, collection_id=collection_id)
        role_require_manager(caller=caller, action="delete collections")
        services.collection_delete(collection=collection, actor=caller.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DocumentFileInput(serializers.Serializer[dict[str, object]]):
    """A document as a multipart upload."""

    file = serializers.FileField(
        allow_empty_file=True, help_text="txt, md, html or pdf; its type is read from its bytes"
    )
    title = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)


class DocumentTextInput(serializers.Serializer[dict[str, object]]):
    """A document as JSON text."""

    title = serializers.CharField(max_length=300)
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)
    format = serializers.ChoiceField(choices=["text", "markdown"], default="text")


class CollectionDocumentsApi(APIView):
    required_scopes = {"GET": "read", "POST": "ingest"}
    parser_classes = [MultiPartParser, JSONParser]
    pagination_class = Pagination

    class InputSerializer(serializers.Serializer[dict[str, object]]):
        file = serializers.FileField(required=False, allow_empty_file=True)
        title = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)
        text = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
        format = serializers.ChoiceField(choices=["text", "markdown"], default="text")

        def validate(self, attrs: dict[str, object]) -> dict[str, object]:
            if "file" not in attrs and "text" not in attrs:
                raise serializers.ValidationError(
                    {
                        "file": serializers.ErrorDetail(
                            "Send a multipart 'file', or JSON with 'title' and 'text'.",
                            code="required",
                        )
                    }
                )
            if "text" in attrs and not attrs.get("title"):
                raise serializers.ValidationError(
                    {
                        "title": serializers.ErrorDetail(
                            "A text document needs a title.", code="required"
                        )
                    }
                )
            return attrs

    @extend_schema(responses=DocumentOutput(many=True))
    def get(self, request: Request, collection_id: int) -> Response:
        """The collection's documents, newest first."""
        collection = selectors.collection_get(
            team=get_caller(request).team, collection_id=collection_id
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(
            selectors.document_list(collection=collection), request, view=self
        )
        return paginator.get_paginated_response(DocumentOutput(page, many=True).data)

    @extend_schema(
        request={"multipart/form-data": DocumentFileInput, "application/json": DocumentTextInput},
        parameters=[idempotency_key_parameter()],
        responses={
            **IDEMPOTENCY_RESPONSES,
            202: DocumentOutput,
            200: DocumentOutput,
            413: OpenApiResponse(description="file_too_large, payload_too_large"),
            415: OpenApiResponse(
                description="unsupported_file_type (not txt, md, html or pdf), "
                "unsupported_media_type"
            ),
        },
    )
    def post(self, request: Request, collection_id: int) -> Response:
        """Add a document (multipart ``file``: txt, md, html, pdf; or JSON ``{title, text}``).

        Answers 202 with the document ``queued`` for ingestion; the same content uploaded
        again to the collection answers 200 with the existing document. The upload checks
        only size, type and encoding: a file the worker cannot read, or one past a limit
        found by reading it (``too_many_pages``, ``too_many_elements``, the parser's time
        or memory), ends ``failed`` with the code and reason in ``error``.
        """
        caller = get_caller(request)
        team = caller.team
        collection = selectors.collection_get(team=team, collection_id=collection_id)
        data = validated(self.InputSerializer, request)
        claim = idempotency_request_claim(request=request, team=team, body=data)
        if claim is not None and claim.status == IdempotencyKey.Status.COMPLETE:
            assert claim.resource_id is not None  # noqa: S101 - a completed claim names it
            document = selectors.document_get(team=team, document_id=claim.resource_id)
            return Response(
                DocumentOutput(document).data,
                status=claim.response_status,
                headers={REPLAYED_HEADER: "true"},
            )
        with idempotency_guard(claim):
            if "file" in data:
                accepted = services.document_create_from_file(
                    collection=collection,
                    upload=data["file"],
                    title=str(data["title"]),
                    caller=caller,
                )
            else:
                accepted = services.document_create_from_text(
                    collection=collection,
                    title=str(data["title"]),
                    text=str(data["text"]),
                    format=str(data["format"]),
                    caller=caller,
                )
        code = status.HTTP_202_ACCEPTED if accepted.created else status.HTTP_200_OK
        if claim is not None:
            idempotency_complete(
                claim=claim, resource_id=accepted.document.pk, response_status=code
            )
        return Response(DocumentOutput(accepted.document).data, status=code)


class DocumentDetailApi(APIView):
    required_scopes = {"GET": "read", "DELETE": "ingest"}

    @extend_schema(responses=DocumentOutput)
    def get(self, request: Request, document_id: int) -> Response:
        """A document's ingestion status and progress."""
        document = selectors.document_get(team=get_caller(request).team, document_id=document_id)
        return Response(DocumentOutput(document).data)

    @extend_schema(
        responses={
            204: None,
            403: OpenApiResponse(
                description="role_forbidden: a member's (or a key of no user's) delete of a "
                "document it did not upload"
            ),
        }
    )
    def delete(self, request: Request, document_id: int) -> Response:
        """Delete a document and remove its vectors from the index: owners and admins any
        of the team's, a member those they uploaded (signed in or with any of their keys),
        a key of no user those it uploaded."""
        caller = get_caller(request)
        document = selectors.document_get(team=caller.team, document_id=document_id)
        role_require_own_or_manager(
            caller=caller,
            user_id=document.user_id,
            api_key_id=document.api_key_id,
            action="delete other members' documents",
        )
        services.document_delete(document=document, actor=caller.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SearchFiltersInput(serializers.Serializer[services.SearchFilters]):
    """Metadata filters, applied inside the search (not to its top-k): only chunks that
    match every filter given are ranked. A filter naming another team's document, or no
    document at all, matches nothing."""

    document_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        required=False,
        allow_empty=False,
        max_length=100,
        help_text="only chunks of these documents",
    )
    titles = serializers.ListField(
        child=serializers.CharField(max_length=300),
        required=False,
        allow_empty=False,
        max_length=100,
        help_text="only chunks of documents with one of these titles (exact match)",
    )

    def to_internal_value(self, data: Any) -> services.SearchFilters:
        # A misspelt filter must not silently widen the search to everything.
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, Mapping) else []
        if unknown:
            raise serializers.ValidationError(
                {
                    str(unknown[0]): serializers.ErrorDetail(
                        "Unknown filter: the filters are document_ids and titles.",
                        code="invalid",
                    )
                }
            )
        attrs = super().to_internal_value(data)
        return services.SearchFilters(
            document_ids=tuple(attrs["document_ids"]) if "document_ids" in attrs else None,
            titles=tuple(attrs["titles"]) if "titles" in attrs else None,
        )


def search_mode_field() -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=list(services.SEARCH_MODES),
        default=services.DEFAULT_SEARCH_MODE,
        help_text="hybrid (default): meaning and exact words, their scores fused; "
        "dense: meaning only (embeds the query); keyword: BM25 over the words only (no "
        "embedding, no tokens charged)",
    )


class SearchResultOutput(serializers.Serializer[services.SearchResult]):
    chunk_id = serializers.IntegerField(source="chunk.id")
    document_id = serializers.IntegerField(source="chunk.document_id")
    collection_id = serializers.IntegerField(source="chunk.collection_id")
    title = serializers.CharField(source="chunk.document.title")
    headings = serializers.ListField(source="chunk.headings", child=serializers.CharField())
    chunk_index = serializers.IntegerField(source="chunk.index")
    score = serializers.FloatField()
    snippet = serializers.CharField()


class SearchOutput(serializers.Serializer[dict[str, object]]):
    results = SearchResultOutput(many=True)


class SearchApi(APIView):
    required_scopes = {"POST": "read"}

    class InputSerializer(serializers.Serializer[dict[str, object]]):
        query = serializers.CharField(max_length=settings.MAX_QUERY_CHARS)
        collections = serializers.ListField(
            child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
            required=False,
            allow_empty=False,
            max_length=100,
        )
        top_k = serializers.IntegerField(min_value=1, max_value=settings.MAX_TOP_K, default=5)
        mode = search_mode_field()
        filters = SearchFiltersInput(required=False)

    @extend_schema(
        request=InputSerializer,
        responses={
            200: SearchOutput,
            404: OpenApiResponse(description="not_found: a collection named is not the team's"),
            429: OpenApiResponse(
                description="the query's embedding tokens do not fit the team's or key's "
                "limits (modes hybrid and dense)"
            ),
        },
    )
    def post(self, request: Request) -> Response:
        """Retrieval only: the chunks best matching ``query``, best first, across the
        caller's collections (all of them unless ``collections`` names some).

        ``mode``: ``hybrid`` (default; ``score`` is the fused score: by default the
        weighted sum of each list's z-scores, comparable within one answer only),
        ``dense`` (cosine similarity) or ``keyword`` (BM25; no tokens charged).
        ``filters`` narrow the chunks searched by document id or title."""
        data = validated(self.InputSerializer, request)
        results = services.chunk_search(
            caller=get_caller(request),
            query=str(data["query"]),
            collection_ids=data.get("collections"),
            top_k=data["top_k"],
            mode=data["mode"],
            filters=data.get("filters"),
        )
        return Response(SearchOutput({"results": results}).data)
