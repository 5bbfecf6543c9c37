"""HTTP for the caller's team's API keys: list, issue (shown once), revoke."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import selectors, services
from apps.accounts.models import ApiKey, Scope
from apps.accounts.permissions import get_caller
from apps.core.pagination import Pagination
from apps.core.tags import TAG_HELP, TAG_MAX_LENGTH, TAG_PATTERN
from apps.core.validation import validated


class ApiKeyOutput(serializers.ModelSerializer[ApiKey]):
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.values))
    user = serializers.SerializerMethodField(help_text="the user it acts for, if any")

    class Meta:
        model = ApiKey
        fields = [
            "prefix",
            "name",
            "tag",
            "scopes",
            "user",
            "created_at",
            "last_used_at",
            "revoked_at",
            "expires_at",
        ]

    def get_user(self, api_key: ApiKey) -> str | None:
        return api_key.user.get_username() if api_key.user else None


class IssuedKeyOutput(ApiKeyOutput):
    """A new key with its secret (``context["secret"]``), shown only in this response."""

    key = serializers.SerializerMethodField(
        help_text="The whole key, shown only in this response: the server keeps its hash."
    )

    class Meta(ApiKeyOutput.Meta):
        fields = [*ApiKeyOutput.Meta.fields, "key"]

    def get_key(self, api_key: ApiKey) -> str:
        return str(self.context["secret"])


class ApiKeyListCreateApi(APIView):
    # Key management is a scope of its own: a leaked read-only key lists, mints and revokes
    # nothing. Sessions have it; a key only when an owner or admin granted it.
    required_scopes = {"GET": "keys", "POST": "keys"}
    pagination_class = Pagination

    class InputSerializer(serializers.Serializer[dict[str, Any]]):
        name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
        tag = serializers.RegexField(
            TAG_PATTERN, max_length=TAG_MAX_LENGTH, required=False, default="", help_text=TAG_HELP
        )
        scopes = serializers.ListField(
            child=serializers.ChoiceField(choices=Scope.values), max_length=len(Scope.values)
        )
        expires_in_days = serializers.IntegerField(
            required=False,
            allow_null=True,
            default=None,
            min_value=1,
            max_value=services.MAX_KEY_LIFETIME_DAYS,
            help_text="the key answers 401 expired_api_key after this many days; "
            "omitted: never, or when the key making it expires",
        )

    @extend_schema(
        responses={
            200: ApiKeyOutput(many=True),
            403: OpenApiResponse(
                description="scope_missing: the caller's key lacks the keys scope; "
                "role_missing: the caller is no member of the team"
            ),
        }
    )
    def get(self, request: Request) -> Response:
        """The team's keys by prefix, newest first, revoked ones included: every key for
        an owner or admin (signed in or with their key); a member's own keys for a member
        signed in; for any other key, itself and the keys it created, transitively."""
        manager = selectors.key_manager_for(caller=get_caller(request))
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(
            selectors.api_key_list(manager=manager), request, view=self
        )
        return paginator.get_paginated_response(ApiKeyOutput(page, many=True).data)

    @extend_schema(
        request=InputSerializer,
        responses={
            201: IssuedKeyOutput,
            403: OpenApiResponse(
                description="scope_missing: the caller's key lacks the keys scope, or a "
                "scope the caller may not grant (its role's, and never one its own key "
                "lacks; keys and ingest: owners and admins only); role_missing: no member "
                "of the team"
            ),
        },
    )
    def post(self, request: Request) -> Response:
        """Issue a key for the caller's team and user, optionally expiring. The response
        holds the whole key, once: afterwards only its prefix is known. A key issued with a
        key never outlives it, and is revoked with it."""
        data = validated(self.InputSerializer, request)
        manager = selectors.key_manager_for(caller=get_caller(request))
        issued = services.api_key_issue(
            manager=manager,
            name=data["name"],
            scopes=data["scopes"],
            expires_in_days=data["expires_in_days"],
            tag=data["tag"],
        )
        output = IssuedKeyOutput(issued.api_key, context={"secret": issued.secret})
        return Response(output.data, status=status.HTTP_201_CREATED)


class ApiKeyRevokeApi(APIView):
    required_scopes = {"DELETE": "keys"}

    @extend_schema(
        responses={
            204: None,
            403: OpenApiResponse(description="scope_missing: the caller's key lacks keys"),
            404: OpenApiResponse(description="not_found: no key the caller may manage"),
        }
    )
    def delete(self, request: Request, prefix: str) -> Response:
        """Revoke a key and the keys it created, transitively: from now on they answer 401
        ``revoked_api_key``."""
        manager = selectors.key_manager_for(caller=get_caller(request))
        api_key = selectors.api_key_get_managed(manager=manager, prefix=prefix)
        services.api_key_revoke(api_key=api_key, actor=manager.caller.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)
