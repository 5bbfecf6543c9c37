from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.services import team_create
from apps.core.exceptions import ApplicationError


class Command(BaseCommand):
    help = "Create a team."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--time-zone", default="UTC")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            team = team_create(name=options["name"], time_zone=options["time_zone"])
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(f"created team {team.name!r} (id {team.pk})")
