from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.accounts.models import ApiKey, Team
from apps.usage.models import Reservation


def default_index_backend() -> str:
    """Where a new collection keeps its index: ``VECTOR_BACKEND``."""
    return str(settings.VECTOR_BACKEND)


class Collection(models.Model):
    """A team's set of documents, with one index of its own (vectors and keywords).

    ``index_base`` and ``index_version`` name the live index segments: the base made at
    ``index_base`` and a delta for every version after it (``retrieval.store``). They move
    in the same transaction that changes the chunks, so web processes can tell when to
    reload and a rolled-back write never becomes visible.

    ``index_backend`` says where the index lives (``apps.knowledge.backends``): FAISS
    segment files, or an engine (Milvus), which keeps no segments (its base is always its
    version). ``manage.py reindex --to`` moves a collection, holding its row.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="collections")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    index_version = models.PositiveIntegerField(default=0, editable=False)
    index_base = models.PositiveIntegerField(default=0, editable=False)
    index_backend = models.CharField(
        max_length=16,
        choices=[("faiss", "FAISS segment files"), ("milvus", "Milvus engine")],
        default=default_index_backend,
        editable=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="collection_unique_team_name")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def index_key(self) -> str:
        return str(self.pk)


class Document(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        PROCESSING = "processing"
        INDEXED = "indexed"
        FAILED = "failed"

    class Stage(models.TextChoices):
        PARSE = "parse"
        CHUNK = "chunk"
        EMBED = "embed"
        INDEX = "index"
        DONE = "done"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="documents")
    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="documents")
    # Who uploaded it, so a member may delete their own; empty for the ``ingest`` command.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    tag = models.CharField(
        max_length=32, blank=True, help_text="the purpose tag its ingestion is charged under"
    )
    title = models.CharField(max_length=300)
    filename = models.CharField(max_length=300, blank=True)
    media_type = models.CharField(max_length=100)
    source = models.FileField(upload_to="documents/%Y/%m/")
    size_bytes = models.PositiveBigIntegerField()
    content_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.PARSE)
    progress = models.PositiveSmallIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0)
    enqueued_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="when the document last joined the ingestion line (its team's order)",
    )
    dispatched_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="when the fair dispatcher handed it to the workers; empty while it waits",
    )
    lost_deliveries = models.PositiveSmallIntegerField(
        default=0,
        editable=False,
        help_text="deliveries of the current stage that started and never finished (the "
        "worker process died); the document is quarantined when they reach the limit",
    )
    worker_seconds = models.FloatField(
        default=0.0,
        editable=False,
        help_text="the workers' time spent on its stages (wall clock)",
    )
    page_count = models.PositiveIntegerField(null=True, blank=True)
    chunk_count = models.PositiveIntegerField(default=0)
    embedding_tokens = models.PositiveBigIntegerField(default=0)
    reservation = models.ForeignKey(
        Reservation,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        editable=False,
        help_text="the embedding tokens held against the team's quota for this run",
    )
    parsed = models.JSONField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    indexed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["collection", "content_hash"], name="document_unique_collection_content"
            )
        ]
        indexes = [
            models.Index(fields=["status", "updated_at"]),
            # The fair dispatcher's line: each team's waiting documents, oldest first.
            models.Index(
                fields=["team", "enqueued_at"],
                condition=models.Q(
                    status__in=["queued", "processing"],
                    enqueued_at__isnull=False,
                    dispatched_at__isnull=True,
                ),
                name="document_waiting_line",
            ),
        ]

    def __str__(self) -> str:
        return self.title


class IngestionShare(models.Model):
    """How much of the workers' time a team has used lately, for the fair dispatcher: worker
    seconds as of ``updated_at``, halving every ``INGEST_FAIR_HALF_LIFE_SECONDS`` since.

    A row per team, not a sum over its documents: deleting documents, or waiting for each
    one to finish before sending the next, does not wipe what the team has used."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, primary_key=True, related_name="+")
    seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.team_id}: {self.seconds:.1f} s"


class Chunk(models.Model):
    """A span of a document, embedded; its primary key is its id in the FAISS index.

    The vector is kept here as well, so an index can be rebuilt without re-embedding.
    """

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    text = models.TextField()
    headings = models.JSONField(default=list)
    token_count = models.PositiveIntegerField()
    embedding = models.BinaryField(null=True, editable=False)

    class Meta:
        ordering = ["document_id", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["document", "index"], name="chunk_unique_document_index"
            )
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.index}"
