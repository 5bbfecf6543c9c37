from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.selectors import team_get_by_name
from apps.chat.services.teams import team_purge
from apps.core.audit import Actor


class Command(BaseCommand):
    help = (
        "Delete a team and everything it owns: conversations (answers running are stopped "
        "first), collections, documents, index folders, uploaded files, cached answers, "
        "keys, usage rows and limiter state in Redis. Prints what went."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True, help="the team's name")
        parser.add_argument(
            "--yes", action="store_true", help="confirm: nothing of the team can be recovered"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        team = team_get_by_name(name=options["team"])
        if team is None:
            raise CommandError(f"no team named {options['team']!r}")
        if not options["yes"]:
            raise CommandError("pass --yes to delete the team and everything it owns")
        report = team_purge(team=team, actor=Actor.command("deleteteam"))
        for name, value in asdict(report).items():
            self.stdout.write(f"{name}: {value}")
