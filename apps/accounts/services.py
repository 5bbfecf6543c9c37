"""Writes for teams, memberships and API keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiKey, Membership, Scope, Team
from apps.accounts.selectors import KeyManager, api_key_cache
from apps.core.audit import SYSTEM, Actor, audit_record
from apps.core.exceptions import InvalidRequest, PermissionDenied
from apps.core.models import AuditEvent

KEY_NAMESPACE = "rt"
PREFIX_BYTES = 6
SECRET_BYTES = 32
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_KEY_LIFETIME_DAYS = 3650


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


def membership_add(
    *, team: Team, user: AbstractBaseUser, role: str = Membership.Role.MEMBER
) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        team=team, user=user, defaults={"role": role}
    )
    return membership


def api_key_validate(
    *, team: Team, user: AbstractBaseUser | None, expires_at: datetime | None
) -> None:
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
    user: AbstractBaseUser | None = None,
    expires_at: datetime | None = None,
    actor: Actor = SYSTEM,
) -> IssuedKey:
    scopes = sorted(set(scopes if scopes is not None else Scope.values))
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
    )
    audit_record(
        action=AuditEvent.Action.KEY_CREATED,
        actor=actor,
        team=team,
        target=f"key {prefix}",
        detail={
            "scopes": scopes,
            "user": user.get_username() if user is not None else None,
            "expires_at": _iso(expires_at),
        },
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
    *, manager: KeyManager, name: str, scopes: list[str], expires_in_days: int | None = None
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
    return api_key_create(
        team=caller.team,
        name=name,
        scopes=scopes,
        user=caller.user,
        expires_at=expires_at,
        actor=caller.actor,
    )


def api_key_revoke(*, api_key: ApiKey, actor: Actor = SYSTEM) -> ApiKey:
    """Revoke the key: at once in this process, in others once their cached copy expires."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        audit_record(
            action=AuditEvent.Action.KEY_REVOKED,
            actor=actor,
            team=api_key.team,
            target=f"key {api_key.prefix}",
        )
    api_key_cache().forget(prefix=api_key.prefix)
    return api_key


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
