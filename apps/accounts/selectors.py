"""Reads for accounts, and the caller an API request acts for."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from apps.accounts.models import ApiKey, Membership, Scope, Team


@dataclass(frozen=True)
class Caller:
    """Who is asking: the team every query is scoped to, and what they may do."""

    team: Team
    user: AbstractBaseUser | None
    api_key: ApiKey | None
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return scope in self.scopes


def api_key_get_by_prefix(*, prefix: str) -> ApiKey | None:
    return ApiKey.objects.select_related("team", "user").filter(prefix=prefix).first()


def caller_for(
    *, user: AbstractBaseUser | AnonymousUser | None, api_key: ApiKey | None
) -> Caller | None:
    """The caller of a request, or None when it carries no usable identity or team."""
    if api_key is not None:
        return Caller(api_key.team, api_key.user, api_key, frozenset(api_key.scopes))
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
