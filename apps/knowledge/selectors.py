"""Reads for the knowledge app. Every query is scoped to a team: another team's object
is indistinguishable from a missing one."""

from __future__ import annotations

from django.db.models import Count, QuerySet

from apps.accounts.models import Team
from apps.core.exceptions import NotFound
from apps.knowledge.models import Collection, Document


def collection_list(*, team: Team) -> QuerySet[Collection]:
    return (
        Collection.objects.filter(team=team)
        .annotate(document_count=Count("documents"))
        .order_by("name")
    )


def collection_get(*, team: Team, collection_id: int) -> Collection:
    collection = collection_list(team=team).filter(pk=collection_id).first()
    if collection is None:
        raise NotFound(f"No collection {collection_id}.")
    return collection


def collection_list_readable(*, team: Team, ids: list[int] | None = None) -> list[Collection]:
    """The team's collections, all or those named; naming one it cannot read is a 404."""
    collections = Collection.objects.filter(team=team)
    if ids is None:
        return list(collections)
    found = {collection.pk: collection for collection in collections.filter(pk__in=ids)}
    missing = [pk for pk in ids if pk not in found]
    if missing:
        raise NotFound(f"No collection {missing[0]}.", param="collections")
    return [found[pk] for pk in dict.fromkeys(ids)]


def document_get(*, team: Team, document_id: int) -> Document:
    document = Document.objects.filter(team=team, pk=document_id).first()
    if document is None:
        raise NotFound(f"No document {document_id}.")
    return document


def document_list(*, collection: Collection) -> QuerySet[Document]:
    return Document.objects.filter(collection=collection).order_by("-created_at")
