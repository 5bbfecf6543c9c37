"""The audit log: key creation, revocation, expiry changes and deletion, limit changes,
purges, deletes of documents, collections and whole teams, and admin logins, successful
and failed.

Services record their own events (``audit_record``), so an action is logged whichever
surface made it: the API, the admin, a management command or a beat job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest

from apps.accounts.models import Team
from apps.core.models import AuditEvent


@dataclass(frozen=True)
class Actor:
    """Who acted: a signed-in user, a key (with its user, if any), a command or a job."""

    label: str
    user: User | None = None

    @classmethod
    def of_user(cls, user: User | AnonymousUser | None) -> Actor:
        if user is None or not user.is_authenticated:
            return cls("anonymous")
        return cls(f"user {user.get_username()}", user)

    @classmethod
    def command(cls, name: str) -> Actor:
        return cls(f"manage.py {name}")

    @classmethod
    def job(cls, name: str) -> Actor:
        return cls(f"job {name}")


SYSTEM = Actor("system")
"""The actor of a service call that named none (setup scripts, tests)."""


def audit_record(
    *,
    action: AuditEvent.Action,
    actor: Actor,
    team: Team | None = None,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        action=action,
        actor=actor.label[:200],
        actor_user=actor.user,
        team=team,
        team_name=team.name if team is not None else "",
        target=target[:200],
        detail=detail or {},
    )


def _is_admin_login(request: HttpRequest | None) -> bool:
    match = getattr(request, "resolver_match", None)
    return match is not None and match.namespace == "admin" and match.url_name == "login"


def admin_login_record(
    sender: Any, *, request: HttpRequest | None, user: User, **kwargs: Any
) -> None:
    """``user_logged_in`` receiver: a login through the admin's own login page."""
    if _is_admin_login(request):
        audit_record(action=AuditEvent.Action.ADMIN_LOGIN, actor=Actor.of_user(user))


def admin_login_failure_record(
    *, request: HttpRequest | None, credentials: dict[str, Any], locked_out: bool
) -> None:
    """A failed login through the admin's login page: the username tried, the client's
    address and whether this failure locked them out.

    Only the username is read from ``credentials`` (Django has already masked the password
    there, but nothing else in it belongs in a log).
    """
    if request is None or not _is_admin_login(request):
        return
    username = str(credentials.get("username") or "")
    audit_record(
        action=AuditEvent.Action.ADMIN_LOGIN_FAILED,
        actor=Actor("anonymous"),
        target=f"user {username}" if username else "",
        detail={"address": request.META.get("REMOTE_ADDR", ""), "locked_out": locked_out},
    )
