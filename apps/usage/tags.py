"""The purpose tags a team uses (:mod:`apps.core.tags`), capped per team.

A request's tag is admitted before any expensive work: one the team has used before
passes (known to this process after its first use, so most requests read nothing); a new
one is recorded, unless the team already has ``USAGE_TAGS_MAX_PER_TEAM`` (400
``too_many_tags``: a client that tags each request by user or by request id would make
the report unreadable and the table unbounded). A key's default tag, set when the key is
issued by someone who manages the team's keys, is not counted against the cap."""

from __future__ import annotations

import dataclasses

from django.conf import settings
from django.db import transaction
from django.db.models import signals

from apps.accounts.models import Team
from apps.accounts.selectors import Caller
from apps.core.aio import db_call
from apps.core.exceptions import InvalidRequest
from apps.core.tags import tag_check
from apps.usage.models import UsageTag

_known: set[tuple[int, str]] = set()
"""(team id, tag) admitted in this process: forgotten when any tag row goes (a team
purged, a tag deleted in the admin), so a deleted tag counts against the cap again."""


def _forget(**_: object) -> None:
    _known.clear()


signals.post_delete.connect(_forget, sender=UsageTag, weak=False)


async def caller_tagged(caller: Caller, tag: object, *, param: str = "tag") -> Caller:
    """``caller`` with the tag its request names (checked, and admitted for its team), or
    as it is (its key's default) when the request names none."""
    if tag is None or tag == "":
        return caller
    name = tag_check(tag, param=param)
    if (caller.team.pk, name) not in _known:
        await db_call(tag_admit)(team=caller.team, name=name, param=param)
    return dataclasses.replace(caller, tag=name)


def tag_admit(*, team: Team, name: str, param: str = "tag") -> None:
    """Record ``name`` among the team's tags, or 400 ``too_many_tags`` past the cap. The
    team's row is locked while it counts, so that two new tags at once cannot both pass."""
    with transaction.atomic():
        if not UsageTag.objects.filter(team=team, name=name).exists():
            Team.objects.select_for_update().filter(pk=team.pk).first()
            cap = settings.USAGE_TAGS_MAX_PER_TEAM
            if UsageTag.objects.filter(team=team).count() >= cap:
                raise InvalidRequest(
                    f"{param}: the team already uses {cap} tags; reuse one of them.",
                    code="too_many_tags",
                    param=param,
                )
            UsageTag.objects.get_or_create(team=team, name=name)
    _known.add((team.pk, name))
