"""Reads for accounts, and the caller an API request acts for."""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Exists, OuterRef, QuerySet

from apps.accounts.models import ApiKey, Membership, Scope, Team
from apps.core.audit import Actor
from apps.core.exceptions import NotFound, PermissionDenied

# What each role may put on a key it issues. A key outlives the session that made it and
# runs unattended, so ``ingest`` (writing the team's shared knowledge and spending its
# embedding tokens) and ``keys`` (issuing and revoking keys) are for owners and admins to
# hand out; a member's own session keeps every scope.
ROLE_KEY_SCOPES: dict[str, frozenset[str]] = {
    Membership.Role.OWNER: frozenset(Scope.values),
    Membership.Role.ADMIN: frozenset(Scope.values),
    Membership.Role.MEMBER: frozenset({Scope.CHAT.value, Scope.READ.value}),
}
# Roles that manage every key of the team (and its limits), not only their own keys.
TEAM_MANAGER_ROLES = frozenset({Membership.Role.OWNER, Membership.Role.ADMIN})


@dataclass(frozen=True)
class Caller:
    """Who is asking: the team every query is scoped to, and what they may do."""

    team: Team
    user: User | None
    api_key: ApiKey | None
    scopes: frozenset[str]
    tag: str = ""
    """The purpose tag its usage carries (:mod:`apps.core.tags`): its key's default, or
    the one its request names (``apps.usage.tags.caller_tagged``)."""

    def can(self, scope: str) -> bool:
        return scope in self.scopes

    @property
    def actor(self) -> Actor:
        """The caller as the audit log names it."""
        if self.api_key is None:
            return Actor.of_user(self.user)
        user = f" of user {self.user.get_username()}" if self.user is not None else ""
        return Actor(f"key {self.api_key.prefix}{user}", self.user)


def api_key_get_by_prefix(*, prefix: str) -> ApiKey | None:
    """The key with its team and user, and ``user_in_team``: whether its user (if any) is
    still a member of its team, read in the same query so the cached row carries it."""
    membership = Membership.objects.filter(team=OuterRef("team"), user=OuterRef("user"))
    return (
        ApiKey.objects.select_related("team", "user")
        .annotate(user_in_team=Exists(membership))
        .filter(prefix=prefix)
        .first()
    )


def api_key_refusal(*, api_key: ApiKey, now: datetime) -> tuple[str, str] | None:
    """Why a key with a valid secret may not be used, as (code, message); None: it may.

    Revoked, expired, or bound to a user who was deactivated or left the team (which
    works as a revocation: the key answers ``revoked_api_key``).
    """
    if api_key.is_revoked:
        return "revoked_api_key", "The API key was revoked."
    if api_key.is_expired(now=now):
        return "expired_api_key", "The API key expired."
    if api_key.user is not None and not (
        # Loaded without the annotation (not through api_key_get_by_prefix): refuse.
        api_key.user.is_active and getattr(api_key, "user_in_team", False)
    ):
        return "revoked_api_key", "The API key's user was deactivated or left the team."
    return None


class ApiKeyCache:
    """API keys by prefix, as loaded from the database in the last few seconds.

    Authentication reads keys through it so that steady traffic makes no query per
    request. Entries are whole rows with their team and user loaded, revoked ones included,
    so the caller checks revocation on every request; a change made elsewhere (revocation
    in another process, deletion, new scopes, the team's settings) is seen once the
    entry is ``API_KEY_CACHE_SECONDS`` old (5 by default; 0 turns the cache off).
    ``api_key_revoke`` forgets the key in its own process at once.

    Unknown prefixes are kept apart, for the same time, in a list of at most
    ``max_misses`` (a repeated made-up key costs no query), so made-up keys cannot push
    real ones out; it holds at most ``max_entries`` keys and drops the least recently used.
    The secret is not kept: its hash is one SHA-256, as cheap as any digest a cache of
    checks would need.
    """

    def __init__(
        self,
        *,
        max_entries: int = 10_000,
        max_misses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_misses = max_misses
        self.clock = clock
        self._entries: OrderedDict[str, tuple[float, ApiKey]] = OrderedDict()
        self._misses: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self, *, prefix: str, before_query: Callable[[ApiKey | None], None] | None = None
    ) -> ApiKey | None:
        """The key (None: no such prefix), from the cache when fresh, else from the
        database, calling ``before_query`` first (which may raise to refuse the query) with
        the expired copy of the key, if this process still holds one."""
        ttl: float = settings.API_KEY_CACHE_SECONDS
        now = self.clock()
        with self._lock:
            entry = self._entries.get(prefix)
            if entry is not None and now - entry[0] < ttl:
                self._entries.move_to_end(prefix)
                return entry[1]
            missed = self._misses.get(prefix)
            if missed is not None and now - missed < ttl:
                return None
        if before_query is not None:
            before_query(entry[1] if entry is not None else None)
        # The query runs outside the lock: two threads may both load; the last one stays.
        api_key = api_key_get_by_prefix(prefix=prefix)
        with self._lock:
            if api_key is None or ttl <= 0:
                self._entries.pop(prefix, None)
                if api_key is None and ttl > 0:
                    self._misses[prefix] = now
                    self._misses.move_to_end(prefix)
                    while len(self._misses) > self.max_misses:
                        self._misses.popitem(last=False)
                return api_key
            self._misses.pop(prefix, None)
            self._entries[prefix] = (now, api_key)
            self._entries.move_to_end(prefix)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return api_key

    def __len__(self) -> int:
        return len(self._entries)

    def forget(self, *, prefix: str) -> None:
        with self._lock:
            self._entries.pop(prefix, None)
            self._misses.pop(prefix, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._misses.clear()


@functools.cache
def api_key_cache() -> ApiKeyCache:
    """This process's cache of API keys (see ``ApiKeyCache``)."""
    return ApiKeyCache()


def caller_for(*, user: User | AnonymousUser | None, api_key: ApiKey | None) -> Caller | None:
    """The caller of a request, or None when it carries no usable identity or team."""
    if api_key is not None:
        scopes = frozenset(api_key.scopes)
        return Caller(api_key.team, api_key.user, api_key, scopes, tag=api_key.tag)
    if user is None or not user.is_authenticated:
        return None
    membership = (
        Membership.objects.select_related("team").filter(user=user).order_by("created_at").first()
    )
    if membership is None:
        return None
    # A signed-in member acts with every scope of their team.
    return Caller(membership.team, user, None, frozenset(Scope.values))


def team_get_by_name(*, name: str) -> Team | None:
    return Team.objects.filter(name=name).first()


def membership_role(*, team: Team, user: User | None) -> str | None:
    """The user's role in ``team``, or None when they are not a member (or no user)."""
    if user is None or not user.is_authenticated:
        return None
    role: str | None = (
        Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
    )
    return role


def caller_role(*, caller: Caller) -> str | None:
    """The caller's role in its team: its user's, a member's for a key of no user (it runs
    unattended, for no one in particular), None for a user who is no member."""
    if caller.user is None:
        return Membership.Role.MEMBER
    return membership_role(team=caller.team, user=caller.user)


@dataclass(frozen=True)
class KeyManager:
    """What a caller may do with its team's keys."""

    caller: Caller
    role: str
    grantable: frozenset[str]
    """Scopes a key it issues may carry: its role's, and never more than its own key's."""

    @property
    def manages_team(self) -> bool:
        """Owners and admins see and revoke every key of the team; members only their own."""
        return self.role in TEAM_MANAGER_ROLES


def key_manager_for(*, caller: Caller) -> KeyManager:
    """The caller as a manager of keys. A user acts with their role in the team; a key of
    no user (a team key from the admin or ``createapikey``) as a member. What a member
    manages is in ``api_key_list``. 403 for a caller who is no member (a user's key whose
    user left is already refused at authentication, once its cached row is reloaded)."""
    role = caller_role(caller=caller)
    if role is None:
        raise PermissionDenied(
            "Only a member of the team, signed in or with their own key, manages keys.",
            code="role_missing",
        )
    grantable = ROLE_KEY_SCOPES.get(role, frozenset()) & caller.scopes
    return KeyManager(caller=caller, role=role, grantable=grantable)


def api_key_list(*, manager: KeyManager) -> QuerySet[ApiKey]:
    """The keys the manager may see, newest first, revoked ones included: every key of the
    team for an owner or admin (signed in or with their key); for a member signed in, their
    own keys; for any other key, itself and the keys it created, transitively (so a
    leaked key reaches no key it did not make)."""
    keys = ApiKey.objects.filter(team=manager.caller.team).select_related("user")
    own_key = manager.caller.api_key
    if own_key is not None and not manager.manages_team:
        keys = keys.filter(pk__in={own_key.pk, *api_key_descendant_ids(api_key_ids=[own_key.pk])})
    elif not manager.manages_team:
        keys = keys.filter(user=manager.caller.user)
    return keys.order_by("-created_at", "-pk")


def api_key_descendant_ids(*, api_key_ids: Collection[int]) -> set[int]:
    """The keys issued by these keys, by the keys those issued, and so on (not these)."""
    found: set[int] = set()
    frontier = set(api_key_ids)
    while frontier:
        children = set(ApiKey.objects.filter(parent__in=frontier).values_list("pk", flat=True))
        frontier = children - found - set(api_key_ids)
        found |= frontier
    return found


def api_key_get_managed(*, manager: KeyManager, prefix: str) -> ApiKey:
    """One key the manager may revoke; a key it may not see is a 404, like a missing one."""
    api_key = api_key_list(manager=manager).filter(prefix=prefix).first()
    if api_key is None:
        raise NotFound(f"No API key {prefix!r}.")
    return api_key
