from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.accounts.models import ApiKey, Team
from apps.core.fields import EncryptedJSONField, EncryptedTextField


class Conversation(models.Model):
    """A thread of messages. ``title`` is encrypted at rest like the messages: the page
    derives it from the first question."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="conversations")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    title = EncryptedTextField(blank=True)
    collection_ids = models.JSONField(
        null=True, blank=True, help_text="collections searched by default; empty: all readable"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title or f"conversation {self.pk}"


class Message(models.Model):
    """One turn. An assistant message carries its citations and its exact usage.

    ``content`` and ``reasoning`` are encrypted at rest (:mod:`apps.core.crypto`).

    ``prompt_tokens`` includes ``cached_tokens``; ``completion_tokens`` includes
    ``reasoning_tokens``.
    """

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming"
        DETACHED = "detached"
        """Still generating, with nobody reading: its client dropped (:mod:`.services.detach`)."""
        COMPLETE = "complete"
        FAILED = "failed"
        CANCELLED = "cancelled"

    RUNNING = (Status.STREAMING, Status.DETACHED)
    """The statuses of an answer still generating, whoever reads it."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = EncryptedTextField(blank=True)
    reasoning = EncryptedTextField(blank=True)
    citations = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    cancel_requested = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=32, blank=True)
    error = models.JSONField(null=True, blank=True)
    model = models.CharField(max_length=64, blank=True, help_text="the alias that served")
    served_model = models.CharField(max_length=200, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    reasoning_tokens = models.PositiveIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    queue_ms = models.PositiveIntegerField(
        default=0, help_text="time spent waiting for a slot at the inference tier"
    )
    usage_source = models.CharField(max_length=16, blank=True)
    cache_hit = models.BooleanField(default=False, help_text="answered by the response cache")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.role} {self.pk}"


class ConversationSummary(models.Model):
    """The oldest turns of a conversation, summarised by the small alias when its history
    overflows the window (``HISTORY_POLICY=summarize``, :mod:`apps.chat.services.compaction`).

    It covers the oldest ``covered_turns`` history messages the answer read; ``marks`` holds
    a keyed hash (HMAC, so the column says nothing of the text) of each of them with the
    team and the conversation, and ``covers`` one hash of them all: a summary is reused
    only by that team's conversation, while the turns it covers that the history still
    reads are unchanged (the oldest may have left the history read, ``HISTORY_MESSAGES``).
    ``text`` is encrypted at rest like the messages; empty while ``completed_at`` is unset
    (a build under way, claimed by the unique ``covers``)."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="summaries"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="summaries")
    covered_turns = models.PositiveIntegerField()
    covers = models.CharField(max_length=64)
    marks = models.JSONField(default=list, help_text="a keyed hash of each turn covered")
    text = EncryptedTextField(blank=True)
    tokens = models.PositiveIntegerField(
        default=0, help_text="the text's tokens with the small model's tokenizer"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "covers"], name="conversation_summary_unique_covers"
            )
        ]

    def __str__(self) -> str:
        return f"summary of {self.covered_turns} turns of {self.conversation_id}"


class MessageEvent(models.Model):
    """The SSE events of an answer, kept for replay and resume (``Last-Event-ID``);
    ``data`` (answer text among it) is encrypted at rest. A row holds one event, or (event
    ``batch``, see :mod:`apps.chat.event_store`) the events of one journal flush, ``seq``
    being the last one's."""

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    event = models.CharField(max_length=16)
    data = EncryptedJSONField()

    class Meta:
        ordering = ["message_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["message", "seq"], name="message_event_unique_seq")
        ]

    def __str__(self) -> str:
        return f"{self.message_id}#{self.seq} {self.event}"
