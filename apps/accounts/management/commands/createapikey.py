from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.models import Scope
from apps.accounts.selectors import team_get_by_name
from apps.accounts.services import api_key_create
from apps.core.exceptions import ApplicationError


class Command(BaseCommand):
    help = "Create an API key and print it, once, on stdout (only the key, for scripts)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True)
        parser.add_argument(
            "--scopes", nargs="+", default=list(Scope.values), choices=list(Scope.values)
        )
        parser.add_argument("--name", default="")
        parser.add_argument("--user", help="username the key acts for (optional)")

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
            issued = api_key_create(
                team=team, name=options["name"], scopes=options["scopes"], user=user
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(issued.secret)
