"""HTTP for the caller's team's usage."""

from __future__ import annotations

from dataclasses import asdict
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

from apps.accounts import selectors as accounts
from apps.accounts.permissions import get_caller
from apps.core.validation import validated
from apps.usage.limits import aliases_unknown, model_aliases
from apps.usage.selectors import (
    GROUPS,
    key_limit_values,
    quota_report,
    usage_keys_shown,
    usage_report,
)
from apps.usage.services import key_limits_set
from apps.usage.values import LimitValues


class UsageRowOutput(serializers.Serializer[dict[str, Any]]):
    """One group's sums (or the total's): ``prompt_tokens`` includes ``cached_tokens``,
    ``completion_tokens`` includes ``reasoning_tokens``."""

    group = serializers.CharField(
        allow_null=True,
        allow_blank=True,
        help_text="the day (YYYY-MM-DD), model, key prefix or kind; null in the total, "
        "and for usage of no key",
    )
    prompt_tokens = serializers.IntegerField(min_value=0)
    cached_tokens = serializers.IntegerField(min_value=0)
    completion_tokens = serializers.IntegerField(min_value=0)
    reasoning_tokens = serializers.IntegerField(min_value=0)
    total_tokens = serializers.IntegerField(min_value=0)
    requests = serializers.IntegerField(min_value=0)
    cost_usd = serializers.DecimalField(
        max_digits=20, decimal_places=6, help_text="a decimal string, to the micro-dollar"
    )
    energy_wh = serializers.FloatField(min_value=0)


class UsageReportOutput(serializers.Serializer[dict[str, Any]]):
    start = serializers.DateField()
    end = serializers.DateField()
    group_by = serializers.ChoiceField(choices=list(GROUPS))
    data = UsageRowOutput(many=True)  # type: ignore[assignment]
    total = UsageRowOutput()


class QuotaBucketOutput(serializers.Serializer[dict[str, Any]]):
    capacity = serializers.IntegerField(min_value=0)
    tokens_per_minute = serializers.IntegerField(min_value=0)
    available = serializers.IntegerField(
        allow_null=True, help_text="tokens available now; null when the limiter is out of reach"
    )


class QuotaPeriodOutput(serializers.Serializer[dict[str, Any]]):
    limit = serializers.IntegerField(min_value=0)
    used = serializers.IntegerField(min_value=0)
    remaining = serializers.IntegerField(min_value=0)
    resets_at = serializers.DateTimeField()


class QuotaLimitOutput(serializers.Serializer[dict[str, Any]]):
    scope = serializers.CharField(help_text="team, or key <prefix>")
    bucket = QuotaBucketOutput(allow_null=True)
    day = QuotaPeriodOutput(allow_null=True)
    month = QuotaPeriodOutput(allow_null=True)
    max_concurrent_streams = serializers.IntegerField(allow_null=True)
    max_tokens = serializers.IntegerField(allow_null=True)


class QuotaOutput(serializers.Serializer[dict[str, Any]]):
    limits = QuotaLimitOutput(many=True)
    unlimited = serializers.BooleanField(help_text="no limit applies")


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
        responses={200: UsageReportOutput},
    )
    def get(self, request: Request) -> Response:
        """Token sums and cost for the caller's team, grouped by day, model, key or kind.

        ``prompt_tokens`` includes ``cached_tokens``; ``completion_tokens`` includes
        ``reasoning_tokens``; cost is derived from tokens with the per-model price table.
        Grouped by key, owners and admins see every key of the team; members only their
        own keys (a key: itself and the keys it created), the total over those.
        """
        query = self.FilterSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        caller = get_caller(request)
        shown = usage_keys_shown(
            manager=accounts.key_manager_for(caller=caller),
            group_by=query.validated_data["group_by"],
        )
        report = usage_report(team=caller.team, api_keys=shown, **query.validated_data)
        return Response(report)


def _count_field(*, big: bool = False) -> serializers.IntegerField:
    """A limit's count, null for none, within its column (a positive big or plain integer)."""
    most = 2**63 - 1 if big else 2**31 - 1
    return serializers.IntegerField(min_value=0, max_value=most, allow_null=True, default=None)


class QuotaApi(APIView):
    required_scopes = {"GET": "read"}

    @extend_schema(responses={200: QuotaOutput})
    def get(self, request: Request) -> Response:
        """The token limits that apply to the caller (team and key): the bucket's capacity,
        refill rate and tokens available now; each period quota's use and reset time."""
        caller = get_caller(request)
        return Response(quota_report(team=caller.team, api_key=caller.api_key))


class KeyLimitsApi(APIView):
    """One key's token limits: read by whoever manages the key, set by owners and admins;
    either needs the ``keys`` scope, as managing the key itself does."""

    required_scopes = {"GET": "keys", "PUT": "keys"}

    class LimitsSerializer(serializers.Serializer[dict[str, Any]]):
        burst_tokens = _count_field(big=True)
        tokens_per_minute = _count_field(big=True)
        daily_tokens = _count_field(big=True)
        monthly_tokens = _count_field(big=True)
        max_concurrent_streams = _count_field()
        max_tokens = _count_field()
        daily_usd = serializers.DecimalField(
            max_digits=14, decimal_places=6, min_value=0, allow_null=True, default=None
        )
        monthly_usd = serializers.DecimalField(
            max_digits=14, decimal_places=6, min_value=0, allow_null=True, default=None
        )
        allowed_models = serializers.ListField(
            child=serializers.CharField(max_length=64),
            max_length=32,
            allow_null=True,
            default=None,
        )

        def validate_allowed_models(self, value: list[str] | None) -> list[str] | None:
            unknown = aliases_unknown(value or [])
            if unknown:
                raise serializers.ValidationError(
                    f"no model alias {unknown}; choose from {model_aliases()}"
                )
            return value

    @extend_schema(responses={200: LimitsSerializer})
    def get(self, request: Request, prefix: str) -> Response:
        """The key's own limits (null: unlimited); the team's apply on top of them."""
        manager = accounts.key_manager_for(caller=get_caller(request))
        api_key = accounts.api_key_get_managed(manager=manager, prefix=prefix)
        return Response(self.LimitsSerializer(asdict(key_limit_values(api_key=api_key))).data)

    @extend_schema(
        request=LimitsSerializer,
        responses={
            200: LimitsSerializer,
            403: OpenApiResponse(description="role_forbidden: only owners and admins"),
        },
    )
    def put(self, request: Request, prefix: str) -> Response:
        """Replace the key's limits; a field left out or null is unlimited. Recorded in the
        audit log with the values before and after."""
        data = validated(self.LimitsSerializer, request)
        manager = accounts.key_manager_for(caller=get_caller(request))
        api_key = accounts.api_key_get_managed(manager=manager, prefix=prefix)
        key_limits_set(manager=manager, api_key=api_key, values=LimitValues(**data))
        return Response(self.LimitsSerializer(asdict(key_limit_values(api_key=api_key))).data)
