from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from apps.accounts.models import ApiKey, Team


class UsageRecord(models.Model):
    """One row per unit of billable work: a generation, an ingestion job, a query embedding.

    Token fields follow the binding rules: ``prompt_tokens`` includes ``cached_tokens`` and
    ``completion_tokens`` includes ``reasoning_tokens``; totals never add the subsets.
    """

    class Kind(models.TextChoices):
        CHAT = "chat"
        EMBEDDING = "embedding"

    class Status(models.TextChoices):
        OK = "ok"
        ERROR = "error"
        CANCELLED = "cancelled"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="usage_records")
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_records"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    model = models.CharField(max_length=200, help_text="the alias (or model) that served")
    requested_model = models.CharField(
        max_length=64, blank=True, help_text="the alias asked for (auto before routing)"
    )
    upstream = models.CharField(
        max_length=500, blank=True, help_text="the inference server that served (internal)"
    )
    operation = models.CharField(max_length=32, help_text="what spent the tokens: query, ingest…")
    tag = models.CharField(
        max_length=32, blank=True, help_text="the purpose tag the request named, or its key's"
    )
    object_id = models.CharField(max_length=64, blank=True, help_text="document, message…")
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    reasoning_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=16, decimal_places=10, default=0)
    energy_wh = models.FloatField(default=0.0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    queue_ms = models.PositiveIntegerField(
        default=0, help_text="time spent waiting for a slot at the inference tier"
    )
    cache_hit = models.BooleanField(
        default=False, help_text="answered by the response cache: no generation charged"
    )
    context_window = models.PositiveIntegerField(
        null=True, blank=True, help_text="the served model's window (chat)"
    )
    dropped_passages = models.PositiveIntegerField(
        default=0, help_text="passages found that the window left out"
    )
    dropped_turns = models.PositiveIntegerField(
        default=0, help_text="history messages the window left out"
    )
    summarized_turns = models.PositiveIntegerField(
        default=0, help_text="history messages replaced by a summary"
    )
    dropped_tokens = models.PositiveIntegerField(
        default=0,
        help_text="the tokens the passages and turns left out or summarised would have taken",
    )
    detached_unread_tokens = models.PositiveIntegerField(
        default=0,
        help_text="of the completion tokens, those made while the client was gone (the "
        "answer detached) and never read",
    )
    route_reason = models.CharField(
        max_length=64,
        blank=True,
        help_text="why this alias served: the prompt's length, the allow-list, a fallback…",
    )
    energy_source = models.CharField(
        max_length=16,
        blank=True,
        help_text="where energy_wh came from: nvml or rapl (measured), estimated (the table)",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OK)
    error_code = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["team", "kind", "created_at"]),
            models.Index(fields=["team", "tag", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.total_tokens} tokens for {self.team_id}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageTag(models.Model):
    """A purpose tag a team has used: at most ``USAGE_TAGS_MAX_PER_TEAM`` of them
    (:mod:`apps.usage.tags`)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="usage_tags")
    name = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="usage_tag_unique_per_team")
        ]

    def __str__(self) -> str:
        return self.name


class Limit(models.Model):
    """Token limits of a team (``api_key`` empty) or of one of its keys. Empty = unlimited.

    A token bucket absorbs bursts (``burst_tokens`` capacity, refilled at
    ``tokens_per_minute``); period quotas count tokens per calendar day and month in the
    team's time zone; ``max_concurrent_streams`` bounds answers in flight; ``max_tokens``
    caps what one request may ask for (each model's own cap still applies).

    Money as well as tokens: ``daily_usd`` and ``monthly_usd`` budget what answers and
    embeddings cost at their model's prices, reserved at the worst case and settled at
    the actual cost like token quotas (counted in nano-dollars). A row with a ``tag``
    (and no key) limits the team's requests under that purpose tag.

    Requests, not tokens: on the team's row only, ``requests_per_second`` and
    ``request_burst`` size the bucket every authenticated API request of the team draws
    one from (empty: ``REQUEST_RATE_PER_SECOND`` and ``REQUEST_BURST``; a rate of 0: no
    request limit). They are the exception to "empty = unlimited".
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="limits")
    api_key = models.OneToOneField(
        ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="limit"
    )
    tag = models.CharField(
        max_length=32, blank=True, help_text="the purpose tag it limits (a team's row only)"
    )
    burst_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    daily_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    daily_usd = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="USD per day in the team's time zone, at the models' prices",
    )
    monthly_usd = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="USD per calendar month in the team's time zone",
    )
    max_concurrent_streams = models.PositiveIntegerField(
        null=True, blank=True, help_text="answers being generated at once"
    )
    max_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="cap on a request's max_tokens, under each model's own cap",
    )
    allowed_models = models.JSONField(
        null=True,
        blank=True,
        help_text="the model aliases it may use (a list); empty: any",
    )
    requests_per_second = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="the team's API requests per second, sustained (team row only; "
        "empty: REQUEST_RATE_PER_SECOND; 0: no request limit)",
    )
    request_burst = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="API requests the team may send at once (team row only; empty: REQUEST_BURST)",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team"],
                condition=models.Q(api_key__isnull=True, tag=""),
                name="limit_one_per_team",
            ),
            models.UniqueConstraint(
                fields=["team", "tag"],
                condition=~models.Q(tag=""),
                name="limit_one_per_tag",
            ),
            models.CheckConstraint(
                condition=models.Q(tag="") | models.Q(api_key__isnull=True),
                name="limit_tag_team_only",
                violation_error_message="A tag's limit is the team's: leave its key empty.",
            ),
            models.CheckConstraint(
                condition=models.Q(api_key__isnull=True, tag="")
                | models.Q(requests_per_second__isnull=True, request_burst__isnull=True),
                name="limit_request_rate_team_only",
                violation_error_message="Request rates are the team's: set them on its row, "
                "not on a key's.",
            ),
        ]

    def __str__(self) -> str:
        if self.tag:
            return f"limits of {self.team} under tag {self.tag}"
        return f"limits of {self.api_key or self.team}"


class TokenBucket(models.Model):
    limit = models.OneToOneField(Limit, on_delete=models.CASCADE, related_name="bucket")
    level = models.BigIntegerField()
    refilled_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.level} tokens"


class QuotaCounter(models.Model):
    class Period(models.TextChoices):
        DAY = "day"
        MONTH = "month"

    class Unit(models.TextChoices):
        TOKENS = "tokens"
        USD = "usd", "nano-dollars"

    limit = models.ForeignKey(Limit, on_delete=models.CASCADE, related_name="counters")
    period = models.CharField(max_length=8, choices=Period.choices)
    starts_on = models.DateField()
    unit = models.CharField(max_length=8, choices=Unit.choices, default=Unit.TOKENS)
    used = models.BigIntegerField(
        default=0, help_text="settled plus reserved tokens (or nano-dollars)"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["limit", "period", "starts_on", "unit"],
                name="quota_counter_unique_period_unit",
            )
        ]

    def __str__(self) -> str:
        return f"{self.period} from {self.starts_on}: {self.used} {self.unit}"


class StreamCounter(models.Model):
    """Answers in flight under a limit (the database store; Redis keeps its own)."""

    limit = models.OneToOneField(Limit, on_delete=models.CASCADE, related_name="streams")
    open = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.open} streams open"


class Reservation(models.Model):
    """Tokens held for a request in flight, replaced by actual usage when it settles.

    ``buckets`` and ``slots`` name the limits whose token bucket and stream slot it holds,
    in ``store`` (the database, or Redis when configured); ``counters`` the period quotas it
    charged: the ids of their database counters for the database store, their names
    (``"<limit id>:<period>:<first day>"``, see :func:`apps.usage.budgets.quota_name`) for
    Redis, which counts them until the reservation settles into the database counters.
    A Redis reservation's row may be written after admission (its key taken ahead).
    """

    class Store(models.TextChoices):
        DATABASE = "database"
        REDIS = "redis"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="reservations")
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="reservations"
    )
    kind = models.CharField(
        max_length=16, choices=UsageRecord.Kind.choices, default=UsageRecord.Kind.CHAT
    )
    token = models.UUIDField(default=uuid.uuid4, editable=False, unique=True)
    tokens = models.PositiveBigIntegerField()
    cost_nanos = models.PositiveBigIntegerField(
        default=0, help_text="nano-dollars held against money budgets (the worst case)"
    )
    store = models.CharField(max_length=16, choices=Store.choices, default=Store.DATABASE)
    buckets = models.JSONField(default=list, help_text="ids of the limits whose bucket it drew on")
    slots = models.JSONField(default=list, help_text="ids of the limits whose stream slot it holds")
    counters = models.JSONField(default=list, help_text="ids of the quota counters charged")
    cost_counters = models.JSONField(
        default=list, help_text="the money budgets' counters charged, as ``counters``"
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    actual_tokens = models.BigIntegerField(null=True, blank=True)
    actual_cost_nanos = models.BigIntegerField(null=True, blank=True)
    remote_pending = models.BooleanField(
        default=False, help_text="settled here, but Redis was unreachable: refund it later"
    )

    class Meta:
        indexes = [
            models.Index(
                fields=["expires_at"],
                condition=models.Q(settled_at__isnull=True),
                name="reservation_open",
            ),
            models.Index(
                fields=["id"], condition=models.Q(remote_pending=True), name="reservation_remote"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tokens} tokens for {self.team_id}"
