from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models


class Team(models.Model):
    """Owns every object: collections, documents, conversations, keys and usage."""

    name = models.CharField(max_length=100, unique=True)
    time_zone = models.CharField(max_length=64, default="UTC")
    queue_weight = models.PositiveSmallIntegerField(
        default=1,
        help_text="share of the inference tier while requests queue: a team of weight 2 "
        "is served two requests for every one of a team of weight 1",
    )
    retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="conversations, messages and their answer events older than this many "
        "days are purged (hourly); empty: kept. Usage rows are kept either way",
    )
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="teams"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        """Owners and admins manage every key and limit of the team; members their own keys."""

        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}"


class Scope(models.TextChoices):
    CHAT = "chat"
    INGEST = "ingest"
    READ = "read"
    # Listing, issuing and revoking keys (/api/v1/keys): a key that lacks it cannot mint
    # or revoke keys, so a leaked read-only key stays read-only.
    KEYS = "keys"


class ApiKey(models.Model):
    """A secret shown once: the database keeps a public prefix to look it up and a hash.

    Keys are 256-bit random, so a single SHA-256 is the right hash: slow password hashes
    defend guessable secrets and would only cost a few milliseconds on every request.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_keys")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="api_keys",
        null=True,
        blank=True,
    )
    parent = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="children",
        help_text="the key that issued this one through the API, if any: revoking it "
        "revokes this one too",
    )
    name = models.CharField(max_length=100, blank=True)
    tag = models.CharField(
        max_length=32,
        blank=True,
        help_text="the purpose tag its usage carries when a request names none",
    )
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="from this time the key answers 401; empty: never"
    )

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, *, now: datetime) -> bool:
        """Compared with the clock on every request, so a cached key expires exactly."""
        return self.expires_at is not None and self.expires_at <= now
