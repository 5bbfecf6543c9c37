from __future__ import annotations

from django.conf import settings
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
    model = models.CharField(max_length=200)
    operation = models.CharField(max_length=32, help_text="what spent the tokens: query, ingest…")
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
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OK)
    error_code = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["team", "kind", "created_at"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.total_tokens} tokens for {self.team_id}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
