"""The fair dispatcher: which waiting document's next stage goes to the workers, and when.

The workers get stages from a fair dispatcher, not first come first served: a document
waits in its team's line, and each place among the ``INGEST_MAX_IN_FLIGHT`` stages the
workers hold goes to the team with the fewest there, then to the team that has used the
workers least lately (:func:`ingestion_share_add`: worker seconds that halve every
``INGEST_FAIR_HALF_LIFE_SECONDS``), then to the one waiting longest. When a stage ends, the
document's next stage follows at once unless another team is waiting that has fewer
stages with the workers, or has used them less by more than
``INGEST_FAIR_QUANTUM_SECONDS``; then the place goes back to the dispatcher. So a team
that comes with one document goes ahead of a team with a backlog, or with files that take
long to parse, after about the stage already running; a team that keeps the workers busy
shares them equally with others that do; the embed stage works in slices of
``INGEST_EMBED_SLICE_SECONDS``, so a long document neither outlasts the time limit nor
holds a worker while other teams wait.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Min, QuerySet
from django.utils import timezone

from apps.knowledge.models import Document, IngestionShare
from apps.knowledge.services.stages import ACTIVE, STAGES, Stage

logger = logging.getLogger(__name__)

TASKS = {stage: f"apps.knowledge.tasks.document_{stage}" for stage in STAGES}


def ingestion_enqueue(*, document: Document) -> None:
    """Put the document in its team's line; the dispatcher sends it on after commit, from
    its current stage, when a place with the workers falls to its team."""
    now = timezone.now()
    Document.objects.filter(pk=document.pk).update(
        attempts=F("attempts") + 1,
        enqueued_at=now,
        dispatched_at=None,
        lost_deliveries=0,
        updated_at=now,
    )
    transaction.on_commit(ingestion_dispatch)


def ingestion_dispatch() -> list[int]:
    """Send waiting documents' next stages to the workers, taking turns between teams;
    the documents' ids.

    At most ``INGEST_MAX_IN_FLIGHT`` stages are with the workers at once (0, or tasks run
    eagerly: no cap, first come first served). Each free place goes to the team with the
    fewest stages there, then to the one that has used the workers least lately, then to
    the one waiting longest, and within a team to its oldest document.
    Called when a document joins the line, when a stage gives its place back, and by the
    periodic sweep. Two dispatchers at once never send a document twice (the hand-over is
    a conditional update), though they may overshoot the cap by the places they both saw
    free.
    """
    waiting = _waiting()
    cap = _cap()
    if cap <= 0:
        chosen = list(waiting.order_by("enqueued_at", "pk").values_list("pk", flat=True))
    else:
        in_flight = Document.objects.filter(status__in=ACTIVE, dispatched_at__isnull=False)
        chosen = _fair_choice(waiting, in_flight, places=cap - in_flight.count())
    now = timezone.now()
    sent: list[int] = []
    for document_id in chosen:
        if waiting.filter(pk=document_id).update(dispatched_at=now, updated_at=now):
            stage = Document.objects.filter(pk=document_id).values_list("stage", flat=True)[0]
            if stage in STAGES:
                _send(document_id, stage)
                sent.append(document_id)
    return sent


def _waiting() -> QuerySet[Document]:
    return Document.objects.filter(
        status__in=ACTIVE, enqueued_at__isnull=False, dispatched_at__isnull=True
    ).order_by()


def _cap() -> int:
    return 0 if current_app.conf.task_always_eager else settings.INGEST_MAX_IN_FLIGHT


def _fair_choice(
    waiting: QuerySet[Document], in_flight: QuerySet[Document], *, places: int
) -> list[int]:
    """Up to ``places`` waiting documents, one at a time to the team with the fewest with
    the workers (counting those already chosen), then the one that has used them least
    lately, then the longest waiting."""
    if places <= 0:
        return []
    first_waiting = dict(
        waiting.values("team_id").annotate(first=Min("enqueued_at")).values_list("team_id", "first")
    )
    used = _used_lately(first_waiting)
    busy = _busy(in_flight)
    chosen: list[int] = []
    while first_waiting and len(chosen) < places:
        team_id = min(
            first_waiting,
            key=lambda team: (busy[team], used[team], first_waiting[team], team),
        )
        document_id = (
            waiting.filter(team_id=team_id)
            .exclude(pk__in=chosen)
            .order_by("enqueued_at", "pk")
            .values_list("pk", flat=True)
            .first()
        )
        if document_id is None:
            del first_waiting[team_id]
            continue
        chosen.append(document_id)
        busy[team_id] += 1
    return chosen


def _busy(in_flight: QuerySet[Document]) -> Counter[int]:
    counts = in_flight.order_by().values("team_id").annotate(n=Count("pk"))
    return Counter(dict(counts.values_list("team_id", "n")))


def _decayed(seconds: float, since: datetime, now: datetime) -> float:
    age = max((now - since).total_seconds(), 0.0)
    half_life: float = settings.INGEST_FAIR_HALF_LIFE_SECONDS
    return seconds * math.pow(0.5, age / half_life)


def _used_lately(team_ids: Iterable[int]) -> dict[int, float]:
    """Each team's worker seconds, decayed to now (0 for a team that has used none)."""
    teams = list(team_ids)
    now = timezone.now()
    rows = IngestionShare.objects.filter(team_id__in=teams).values_list(
        "team_id", "seconds", "updated_at"
    )
    used = dict.fromkeys(teams, 0.0)
    used.update({team: _decayed(seconds, since, now) for team, seconds, since in rows})
    return used


def ingestion_share_add(*, team_id: int, seconds: float) -> None:
    """Count ``seconds`` of the workers' time against the team: what it had, decayed to
    now, plus these. A team's use fades by half every ``INGEST_FAIR_HALF_LIFE_SECONDS``,
    so a team that has been away comes back ahead of teams that kept the workers busy,
    and teams that all keep them busy share them equally."""
    now = timezone.now()
    with transaction.atomic():
        share, created = IngestionShare.objects.select_for_update().get_or_create(
            team_id=team_id, defaults={"seconds": seconds, "updated_at": now}
        )
        if not created:
            share.seconds = _decayed(share.seconds, share.updated_at, now) + seconds
            share.updated_at = now
            share.save(update_fields=["seconds", "updated_at"])


def _send(document_id: int, stage: str) -> None:
    """Queue the task of ``stage`` for the document once the current transaction commits."""
    transaction.on_commit(functools.partial(_publish, document_id, stage))


def _publish(document_id: int, stage: str) -> None:
    """Hand the task to the broker; should that fail (the broker is down), put the document
    back in its team's line, where the periodic sweep's dispatch finds it, rather than
    leave its place held by a task that was never sent."""
    signature = current_app.signature(TASKS[stage], args=[document_id], immutable=True)
    try:
        signature.apply_async()
    except Exception:
        logger.exception("document %s: its %s task could not be sent", document_id, stage)
        Document.objects.filter(pk=document_id).update(dispatched_at=None)


def ingestion_send_if_past(document_id: int, stage: str) -> None:
    """A delivery of a stage the document has left, as a chain would handle it.

    The delivery that moved it on may have died between its commit and sending the next
    stage's task (this one is then its re-delivery): send that task. Had it been sent,
    the next stage finds the document further on as well and does the same, so a stale
    duplicate runs through to the stage the document is at, like the rest of a chain.
    Nothing for a document that is gone, failed, indexed, back at an earlier stage, or
    back in its team's line (the dispatcher sends it).
    """
    current = (
        Document.objects.filter(pk=document_id, status__in=ACTIVE, dispatched_at__isnull=False)
        .values_list("stage", flat=True)
        .first()
    )
    if current in STAGES and STAGES.index(current) > STAGES.index(stage):
        _send(document_id, STAGES[STAGES.index(stage) + 1])


def ingestion_send_next(document_id: int, stage: str) -> None:
    """After a stage: the document's next stage (or the rest of an embed slice) while its
    team keeps its turn; else its place back to the dispatcher, the document back in its
    team's line, ahead of the team's later documents. A document that has left the
    workers frees its place."""
    row = Document.objects.filter(pk=document_id).values_list("stage", "status", "team_id")
    document = row.first()
    if document is None or document[1] not in ACTIVE:
        ingestion_dispatch()
        return
    current, _, team_id = document
    if current == stage and stage != Stage.EMBED:
        return  # not moved on: it keeps its place until the stalled sweep
    if _keeps_its_turn(team_id):
        _send(document_id, current)
        return
    Document.objects.filter(pk=document_id, dispatched_at__isnull=False).update(dispatched_at=None)
    ingestion_dispatch()


def _keeps_its_turn(team_id: int) -> bool:
    """Whether a team's document goes on to its next stage at once (it holds one place):
    yes, unless another team is waiting that has fewer stages with the workers than this
    one has besides it, or has used the workers less than this one by more than
    ``INGEST_FAIR_QUANTUM_SECONDS`` (a small document then runs through, and a team that
    has used the workers for long gives way between stages)."""
    if _cap() <= 0:
        return True
    others = set(_waiting().exclude(team_id=team_id).values_list("team_id", flat=True))
    if not others:
        return True
    busy = _busy(Document.objects.filter(status__in=ACTIVE, dispatched_at__isnull=False))
    if busy[team_id] - 1 > min(busy[team] for team in others):
        return False
    used = _used_lately({team_id, *others})
    quantum: float = settings.INGEST_FAIR_QUANTUM_SECONDS
    return used[team_id] <= min(used[team] for team in others) + quantum
