from __future__ import annotations

from django.db import models

from apps.accounts.models import Team


class IdempotencyKey(models.Model):
    """A client's ``Idempotency-Key``, claimed by the first request that sends it.

    The unique constraint on (team, key) is the claim: of two concurrent first requests,
    exactly one inserts the row and does the work; the other finds it ``running`` (409)
    or, once it is ``complete``, replays its result (the same resource id). The request's
    fingerprint (a SHA-256 of its method, path and body) tells a retry from a reuse (422).
    No request or response content is kept.
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETE = "complete"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    resource_id = models.BigIntegerField(
        null=True, blank=True, help_text="the message or document the first request made"
    )
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "key"], name="idempotency_unique_team_key")
        ]

    def __str__(self) -> str:
        return f"{self.team_id}:{self.key} ({self.status})"
