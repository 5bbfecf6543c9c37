from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.accounts.models import Scope
from apps.accounts.selectors import team_get_by_name
from apps.accounts.services import DEFAULT_KEY_SCOPES, api_key_create, key_expiry
from apps.core.audit import Actor
from apps.core.exceptions import ApplicationError


class Command(BaseCommand):
    help = "Create an API key and print it, once, on stdout (only the key, for scripts)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True)
        parser.add_argument(
            "--scopes",
            nargs="+",
            default=list(DEFAULT_KEY_SCOPES),
            choices=list(Scope.values),
            help="default: chat ingest read (keys, to manage keys, only when named)",
        )
        parser.add_argument("--name", default="")
        parser.add_argument("--tag", default="", help="the purpose tag of its usage by default")
        parser.add_argument("--user", help="username the key acts for (optional)")
        parser.add_argument(
            "--expires-in-days",
            type=int,
            metavar="N",
            help="the key answers 401 expired_api_key after N days (default: never)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        team = team_get_by_name(name=options["team"])
        if team is None:
            raise CommandError(f"no team named {options['team']!r}; create it with createteam")
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"no user named {options['user']!r}")
        try:
            expires_at = key_expiry(days=options["expires_in_days"], cap=None, now=timezone.now())
            issued = api_key_create(
                team=team,
                name=options["name"],
                scopes=options["scopes"],
                user=user,
                expires_at=expires_at,
                actor=Actor.command("createapikey"),
                tag=options["tag"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(issued.secret)
