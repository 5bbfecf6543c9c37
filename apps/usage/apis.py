"""HTTP for the caller's team's usage."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import get_caller
from apps.usage.selectors import GROUPS, quota_report, usage_report


class UsageApi(APIView):
    required_scopes = {"GET": "read"}

    class FilterSerializer(serializers.Serializer[dict[str, Any]]):
        start = serializers.DateField(required=False)
        end = serializers.DateField(required=False)
        group_by = serializers.ChoiceField(choices=list(GROUPS), default="day")

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            today = timezone.localdate()
            attrs.setdefault("end", today)
            attrs.setdefault("start", attrs["end"] - timedelta(days=29))
            if attrs["start"] > attrs["end"]:
                raise serializers.ValidationError({"start": "start is after end."})
            if (attrs["end"] - attrs["start"]).days >= settings.MAX_USAGE_REPORT_DAYS:
                raise serializers.ValidationError(
                    {"start": f"at most {settings.MAX_USAGE_REPORT_DAYS} days per report."}
                )
            return attrs

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "start", OpenApiTypes.DATE, description="first day (YYYY-MM-DD), inclusive"
            ),
            OpenApiParameter(
                "end", OpenApiTypes.DATE, description="last day (YYYY-MM-DD), inclusive"
            ),
            OpenApiParameter("group_by", str, enum=list(GROUPS)),
        ],
        responses={
            200: OpenApiResponse(
                response=OpenApiTypes.OBJECT, description="token sums, requests, cost, energy"
            )
        },
    )
    def get(self, request: Request) -> Response:
        """Token sums and cost for the caller's team, grouped by day, model, key or kind.

        ``prompt_tokens`` includes ``cached_tokens``; ``completion_tokens`` includes
        ``reasoning_tokens``; cost is derived from tokens with the per-model price table.
        """
        query = self.FilterSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        report = usage_report(team=get_caller(request).team, **query.validated_data)
        return Response(report)


class QuotaApi(APIView):
    required_scopes = {"GET": "read"}

    @extend_schema(
        responses={
            200: OpenApiResponse(
                response=OpenApiTypes.OBJECT, description="limits and what remains"
            )
        }
    )
    def get(self, request: Request) -> Response:
        """The token limits that apply to the caller (team and key): the bucket's capacity,
        refill rate and tokens available now; each period quota's use and reset time."""
        caller = get_caller(request)
        return Response(quota_report(team=caller.team, api_key=caller.api_key))
