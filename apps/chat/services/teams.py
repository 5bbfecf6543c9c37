"""Deleting a team: everything it owns, through the services that own each part.

Here, in the highest app that holds a team's data, because a team's rows, index folders,
uploaded files, cached answers and Redis keys belong to every app below it. Each part
goes the way its own delete goes (an answer still running is stopped and settled by
``conversation_delete``, an ingestion hold is settled by ``document_delete``, a
collection's folder and files go with ``collection_delete``), so a team deleted in the
admin or by ``manage.py deleteteam`` leaves nothing behind that those deletes would not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from apps.accounts.models import Team
from apps.accounts.services import api_key_revoke
from apps.chat.models import Conversation, Message
from apps.chat.response_cache import response_cache_purge
from apps.chat.services.conversations import answers_stop, conversation_delete
from apps.core.audit import SYSTEM, Actor, audit_record
from apps.core.models import AuditEvent
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_delete, index_store
from apps.usage.limiters import limiter_keys_delete
from apps.usage.models import Limit


@dataclass(frozen=True)
class PurgeReport:
    """What :func:`team_purge` removed."""

    conversations: int = 0
    messages: int = 0
    collections: int = 0
    documents: int = 0
    chunks: int = 0
    index_folders: int = 0
    """Collections' index folders on this machine's data dir, segments and all."""
    files: int = 0
    """Uploaded documents' files."""
    cached_answers: int = 0
    keys: int = 0
    limiter_keys: int = 0
    """Redis keys of the team's and its keys' buckets, stream slots and quotas."""
    rows: dict[str, int] = field(default_factory=dict)
    """Rows that went with the team's own (usage, limits, memberships…), by model."""


def team_purge(*, team: Team, actor: Actor = SYSTEM) -> PurgeReport:
    """Delete ``team`` and everything it owns; what went, also in the audit log.

    The keys go first (revoked, so no process keeps serving them from its cache, and no
    key adds to what is being deleted), then cached answers (none may be replayed once the
    documents they quote are gone), conversations (their answers stopped and settled
    before their rows go), collections with their documents (ingestion holds settled),
    index folders and files, the limiters' Redis state, and last the team's row with what
    still hangs on it.
    """
    name, team_id = team.name, team.pk
    live_keys = team.api_keys.filter(revoked_at__isnull=True).order_by("pk")
    keys = live_keys.count()
    while api_key := live_keys.first():  # first: no key adds to what goes (children too)
        api_key_revoke(api_key=api_key, actor=actor)
    cached_answers = response_cache_purge(team_id=team_id)
    messages = Message.objects.filter(team=team).count()
    answers_stop(messages=Message.objects.filter(team=team))  # all at once, one wait
    conversations = 0
    for conversation in Conversation.objects.filter(team=team).order_by("pk"):
        conversation_delete(conversation=conversation)
        conversations += 1
    documents = Document.objects.filter(team=team)
    files = documents.exclude(source="").count()
    document_count = documents.count()
    chunks = Chunk.objects.filter(document__team=team).count()
    store = index_store()
    collections = index_folders = 0
    # Until none is left: a member's session may still make one while this runs.
    while collection := Collection.objects.filter(team=team).order_by("pk").first():
        index_folders += (store.root / collection.index_key).is_dir()
        collection_delete(collection=collection, actor=actor)  # settles ingestion holds
        collections += 1
    limit_ids = list(Limit.objects.filter(team=team).values_list("pk", flat=True))
    _, rows = Team.objects.filter(pk=team_id).delete()
    limiter_keys = limiter_keys_delete(limit_ids=limit_ids, team_id=team_id)
    report = PurgeReport(
        conversations=conversations,
        messages=messages,
        collections=collections,
        documents=document_count,
        chunks=chunks,
        index_folders=index_folders,
        files=files,
        cached_answers=cached_answers,
        keys=keys,
        limiter_keys=limiter_keys,
        rows={label: count for label, count in sorted(rows.items()) if count},
    )
    audit_record(
        action=AuditEvent.Action.TEAM_PURGED,
        actor=actor,
        target=f"team {team_id} {name}",
        detail=asdict(report),
    )
    return report
