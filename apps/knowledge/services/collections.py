"""Writes for collections."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, transaction

from apps.accounts.models import Team
from apps.core.audit import SYSTEM, Actor, audit_record
from apps.core.exceptions import InvalidRequest
from apps.core.models import AuditEvent
from apps.knowledge.backends import IndexBackend, backend_of
from apps.knowledge.models import Collection, Document
from apps.knowledge.services.stages import ACTIVE, document_release
from apps.knowledge.signals import team_documents_deleted

logger = logging.getLogger(__name__)


def collection_create(*, team: Team, name: str, description: str = "") -> Collection:
    limit = settings.MAX_COLLECTIONS_PER_TEAM
    with transaction.atomic():
        # Lock the team row so two concurrent creates cannot both pass the count.
        Team.objects.select_for_update().filter(pk=team.pk).first()
        if Collection.objects.filter(team=team).count() >= limit:
            raise InvalidRequest(
                f"A team may have at most {limit} collections; delete one first.",
                code="collection_limit_reached",
            )
        try:
            with transaction.atomic():
                return Collection.objects.create(team=team, name=name, description=description)
        except IntegrityError:
            raise InvalidRequest(
                f"A collection named {name!r} exists in this team.",
                code="already_exists",
                param="name",
            ) from None


def collection_delete(*, collection: Collection, actor: Actor = SYSTEM) -> None:
    """The collection, its documents and chunks, with an audit record; once committed, its
    index files, its documents' uploaded files and the team's cached answers (some may
    quote it). A document still being ingested is settled first, as its own delete
    settles it: charged for what it embedded so far, the rest of its hold given back."""
    backend, collection_id, team_id = backend_of(collection), collection.pk, collection.team_id
    with transaction.atomic():
        active = Document.objects.select_for_update().filter(
            collection=collection, status__in=ACTIVE
        )
        for document in active:
            document_release(document=document)
        sources = [
            name
            for name in Document.objects.filter(collection=collection).values_list(
                "source", flat=True
            )
            if name
        ]
        audit_record(
            action=AuditEvent.Action.COLLECTION_DELETED,
            actor=actor,
            team=collection.team,
            target=f"collection {collection.pk} {collection.name}",
            detail={"documents": len(sources)},
        )
        collection.delete()
        transaction.on_commit(lambda: _files_delete(backend, team_id, collection_id, sources))
        transaction.on_commit(
            lambda: team_documents_deleted.send(sender=Collection, team_id=team_id)
        )


def _files_delete(
    backend: IndexBackend, team_id: int, collection_id: int, sources: list[str]
) -> None:
    try:
        backend.drop(team_id=team_id, collection_id=collection_id)
    except Exception:
        # The delete has committed; what the index keeps of it is never returned (its
        # chunks are gone) and index_check --repair removes it.
        logger.exception("collection %s: its index could not be dropped", collection_id)
    storage = Document._meta.get_field("source").storage
    for name in sources:
        storage.delete(name)
