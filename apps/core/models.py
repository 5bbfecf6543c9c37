from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.accounts.models import Team
from apps.core.fields import EncryptedTextField


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


class AuditEvent(models.Model):
    """Who did what to which object of which team, and when: a record for security review.

    Rows are written once by ``apps.core.audit.audit_record`` and never changed (the admin
    may only read them). Names are copied in (``actor``, ``team_name``, ``target``) so a
    row still says who and what after the user, key or team is deleted. No prompt or answer
    content is ever recorded.
    """

    class Action(models.TextChoices):
        KEY_CREATED = "api_key.created"
        KEY_REVOKED = "api_key.revoked"
        KEY_EXPIRY_CHANGED = "api_key.expiry_changed"
        KEY_DELETED = "api_key.deleted"
        LIMIT_CREATED = "limit.created"
        LIMIT_CHANGED = "limit.changed"
        LIMIT_DELETED = "limit.deleted"
        PURGE = "conversations.purged"
        DOCUMENT_DELETED = "document.deleted"
        COLLECTION_DELETED = "collection.deleted"
        TEAM_PURGED = "team.purged"
        ADMIN_LOGIN = "admin.login"
        ADMIN_LOGIN_FAILED = "admin.login_failed"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=32, choices=Action.choices)
    actor = models.CharField(max_length=200, help_text="who: a user, a key, or a job")
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    team = models.ForeignKey(
        Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    team_name = models.CharField(max_length=100, blank=True)
    target = models.CharField(max_length=200, blank=True, help_text="what it was done to")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.action} by {self.actor}"


class ResponseCacheEntry(models.Model):
    """One cached answer of the chat app's response cache (``apps.chat.response_cache``),
    when Redis is not configured. It stays in core, where migration core/0003 made it:
    moving a model between apps takes a state-only migration in each, for no gain.

    ``key`` is a digest of everything the answer depends on; ``payload`` (the answer's
    events) is encrypted at rest. A row past ``expires_at`` is never read, and is purged
    with the team's data (retention, deletes).
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    payload = EncryptedTextField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "key"], name="response_cache_unique_team_key")
        ]

    def __str__(self) -> str:
        return f"{self.team_id}:{self.key[:12]}"
