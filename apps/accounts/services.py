"""Writes for teams, memberships and API keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiKey, Membership, Scope, Team
from apps.accounts.selectors import KeyManager, api_key_cache
from apps.core.audit import SYSTEM, Actor, audit_record
from apps.core.exceptions import InvalidRequest, PermissionDenied, Unauthenticated
from apps.core.models import AuditEvent
from apps.core.tags import tag_check

KEY_NAMESPACE = "rt"
PREFIX_BYTES = 6
SECRET_BYTES = 32
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_KEY_LIFETIME_DAYS = 3650
# A key issued without a choice of scopes: every scope but ``keys``, which is only ever
# granted by name.
DEFAULT_KEY_SCOPES = (Scope.CHAT.value, Scope.INGEST.value, Scope.READ.value)


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    secret: str
    """The full key. It exists only here: the database keeps its hash."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(raw: str) -> tuple[str, str] | None:
    """``rt_<prefix>_<secret>`` → (prefix, raw); None when the shape is wrong."""
    parts = raw.split("_", 2)  # the secret part may itself contain "_"
    if len(parts) != 3 or parts[0] != KEY_NAMESPACE or not parts[1] or not parts[2]:
        return None
    return parts[1], raw


def secret_matches(api_key: ApiKey, raw: str) -> bool:
    return hmac.compare_digest(api_key.secret_hash, hash_secret(raw))


def team_create(*, name: str, time_zone: str = "UTC") -> Team:
    name = name.strip()
    if not name:
        raise InvalidRequest("A team needs a name.", code="missing_field", param="name")
    if Team.objects.filter(name=name).exists():
        raise InvalidRequest(f"A team named {name!r} exists.", code="already_exists", param="name")
    return Team.objects.create(name=name, time_zone=time_zone)


def membership_add(*, team: Team, user: User, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        team=team, user=user, defaults={"role": role}
    )
    return membership


def api_key_validate(*, team: Team, user: User | None, expires_at: datetime | None) -> None:
    """What a new key must satisfy beyond its scopes (the admin's form checks it too)."""
    if user is not None and not Membership.objects.filter(team=team, user=user).exists():
        raise InvalidRequest(
            f"{user.get_username()!r} is not a member of {team.name!r}: a key acts for a "
            "member of its team, and stops working when they leave it.",
            code="invalid_value",
            param="user",
        )
    api_key_expiry_validate(expires_at=expires_at)


def api_key_expiry_validate(*, expires_at: datetime | None) -> None:
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidRequest(
            "A key's expiry must be in the future.", code="invalid_value", param="expires_at"
        )


@transaction.atomic
def api_key_create(
    *,
    team: Team,
    name: str = "",
    scopes: list[str] | None = None,
    user: User | None = None,
    expires_at: datetime | None = None,
    actor: Actor = SYSTEM,
    parent: ApiKey | None = None,
    tag: str = "",
) -> IssuedKey:
    """A new key, with ``DEFAULT_KEY_SCOPES`` when ``scopes`` is None; ``parent`` is the
    key that issues it, if any (revoked with it); ``tag``, the purpose tag of its usage
    when a request names none."""
    if tag:
        tag_check(tag)
    scopes = sorted(set(scopes if scopes is not None else DEFAULT_KEY_SCOPES))
    if not scopes:  # a key of no scope is refused, never read as every scope
        raise InvalidRequest("Choose at least one scope.", code="missing_field", param="scopes")
    unknown = set(scopes) - set(Scope.values)
    if unknown:
        raise InvalidRequest(
            f"Unknown scopes {sorted(unknown)}; choose from {Scope.values}.",
            code="invalid_value",
            param="scopes",
        )
    api_key_validate(team=team, user=user, expires_at=expires_at)
    prefix = secrets.token_hex(PREFIX_BYTES)
    secret = f"{KEY_NAMESPACE}_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"
    api_key = ApiKey.objects.create(
        team=team,
        user=user,
        name=name,
        prefix=prefix,
        secret_hash=hash_secret(secret),
        scopes=scopes,
        expires_at=expires_at,
        parent=parent,
        tag=tag,
    )
    detail: dict[str, object] = {
        "scopes": scopes,
        "user": user.get_username() if user is not None else None,
        "expires_at": _iso(expires_at),
    }
    if parent is not None:
        detail["parent"] = parent.prefix
    audit_record(
        action=AuditEvent.Action.KEY_CREATED,
        actor=actor,
        team=team,
        target=f"key {prefix}",
        detail=detail,
    )
    return IssuedKey(api_key=api_key, secret=secret)


def key_expiry(*, days: int | None, cap: datetime | None, now: datetime) -> datetime | None:
    """``days`` from ``now`` (None: never), but never after ``cap``: a key may not issue a
    key that outlives it, as it may not grant a scope it lacks."""
    if days is not None and not 1 <= days <= MAX_KEY_LIFETIME_DAYS:
        raise InvalidRequest(
            f"expires_in_days must be 1 to {MAX_KEY_LIFETIME_DAYS}.",
            code="invalid_value",
            param="expires_in_days",
        )
    expires_at = now + timedelta(days=days) if days is not None else None
    if cap is not None and (expires_at is None or cap < expires_at):
        return cap
    return expires_at


def api_key_issue(
    *,
    manager: KeyManager,
    name: str,
    scopes: list[str],
    expires_in_days: int | None = None,
    tag: str = "",
) -> IssuedKey:
    """A key for the manager's team and user, carrying only scopes it may grant (its role's,
    and, when it acts with a key, never one that key lacks), and, when it acts with a key
    that expires, expiring no later than that key."""
    if not scopes:
        raise InvalidRequest("Choose at least one scope.", code="missing_field", param="scopes")
    refused = sorted(set(scopes) & set(Scope.values) - manager.grantable)
    if refused:
        raise PermissionDenied(
            f"You may not grant the scope(s) {refused}; you may grant {sorted(manager.grantable)}.",
            code="scope_missing",
            param="scopes",
        )
    caller = manager.caller
    own_key = caller.api_key
    expires_at = key_expiry(
        days=expires_in_days,
        cap=own_key.expires_at if own_key is not None else None,
        now=timezone.now(),
    )
    with transaction.atomic():
        if own_key is not None:
            # Locked, so that a revocation of the issuing key (which locks it too) either
            # sees the new key among its children or comes first and refuses it here: a
            # process whose cached copy is not revoked yet cannot leave a live child.
            stored = ApiKey.objects.select_for_update().only("revoked_at").get(pk=own_key.pk)
            if stored.revoked_at is not None:
                raise Unauthenticated("The API key was revoked.", code="revoked_api_key")
        return api_key_create(
            team=caller.team,
            name=name,
            scopes=scopes,
            user=caller.user,
            expires_at=expires_at,
            actor=caller.actor,
            parent=own_key,
            tag=tag,
        )


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: Actor = SYSTEM) -> ApiKey:
    """Revoke the key and every key it issued, transitively (each audited, the children
    with the key whose revocation took them): at once in this process, in others once
    their cached copy expires. Children are revoked even when the key already was, so a
    key issued by a stale cached copy of a revoked key does not outlive it."""
    _key_revoke(api_key=api_key, actor=actor, detail={})
    frontier = [api_key]
    while frontier:
        parents: dict[int | None, ApiKey] = {key.pk: key for key in frontier}
        frontier = list(
            ApiKey.objects.select_for_update()
            .select_related("team")
            .filter(parent__in=parents)
            .order_by("pk")
        )
        for child in frontier:
            _key_revoke(
                api_key=child, actor=actor, detail={"with": parents[child.parent_id].prefix}
            )
    return api_key


def _key_revoke(*, api_key: ApiKey, actor: Actor, detail: dict[str, object]) -> None:
    stored = ApiKey.objects.select_for_update().only("revoked_at").get(pk=api_key.pk)
    if stored.revoked_at is None:
        api_key.revoked_at = timezone.now()
        ApiKey.objects.filter(pk=api_key.pk).update(revoked_at=api_key.revoked_at)
        audit_record(
            action=AuditEvent.Action.KEY_REVOKED,
            actor=actor,
            team=api_key.team,
            target=f"key {api_key.prefix}",
            detail=detail,
        )
    else:
        api_key.revoked_at = stored.revoked_at
    # Now, and again once committed: a request in between may have cached the old row.
    api_key_cache().forget(prefix=api_key.prefix)
    transaction.on_commit(lambda: api_key_cache().forget(prefix=api_key.prefix))


@transaction.atomic
def api_key_update(
    *, api_key: ApiKey, name: str, expires_at: datetime | None, actor: Actor = SYSTEM
) -> ApiKey:
    """Rename the key or change when it expires (None: never). An expiry change goes to the
    audit log with the values before and after (from the stored row, whatever ``api_key``
    holds), and applies at once in this process, in others once their cached copy expires.
    """
    stored = ApiKey.objects.select_for_update().select_related("team").get(pk=api_key.pk)
    before = stored.expires_at
    if expires_at != before:
        api_key_expiry_validate(expires_at=expires_at)
    stored.name, stored.expires_at = name, expires_at
    stored.save(update_fields=["name", "expires_at"])
    if expires_at != before:
        audit_record(
            action=AuditEvent.Action.KEY_EXPIRY_CHANGED,
            actor=actor,
            team=stored.team,
            target=f"key {stored.prefix}",
            detail={"before": _iso(before), "after": _iso(expires_at)},
        )
    api_key_cache().forget(prefix=stored.prefix)
    return stored


@transaction.atomic
def api_key_delete(*, api_key: ApiKey, actor: Actor = SYSTEM) -> None:
    """Revoke the key (as :func:`api_key_revoke` does, keys it issued included), then
    remove its row, both in the audit log. Its usage rows stay, no longer naming it."""
    api_key_revoke(api_key=api_key, actor=actor)
    audit_record(
        action=AuditEvent.Action.KEY_DELETED,
        actor=actor,
        team=api_key.team,
        target=f"key {api_key.prefix}",
    )
    api_key.delete()


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def api_key_touch(*, api_key: ApiKey, now: datetime | None = None) -> None:
    """Record use, at most once a minute per key: not a database write per request.

    ``api_key`` is usually the cached instance that every request shares, so the time
    written here is what the next request compares with.
    """
    now = now or timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now


@transaction.atomic
def team_bootstrap(*, name: str) -> tuple[Team, bool]:
    """The team called ``name``, created if missing; for setup scripts."""
    team, created = Team.objects.get_or_create(name=name)
    return team, created
