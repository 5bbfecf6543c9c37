from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.accounts.selectors import team_get_by_name
from apps.chat.services.retention import conversations_purge
from apps.core.audit import Actor


class Command(BaseCommand):
    help = (
        "Delete a team's messages older than N days (their answer events too, in the "
        "database and Redis) and its conversations idle that long. Usage rows are kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True, help="the team's name")
        parser.add_argument("--older-than-days", type=int, required=True, metavar="N")

    def handle(self, *args: Any, **options: Any) -> None:
        team = team_get_by_name(name=options["team"])
        if team is None:
            raise CommandError(f"no team named {options['team']!r}")
        days = options["older_than_days"]
        if days < 0:
            raise CommandError("--older-than-days must be 0 or more")
        purged = conversations_purge(
            team=team,
            older_than=timezone.now() - timedelta(days=days),
            actor=Actor.command("purge"),
        )
        self.stdout.write(
            f"{team.name}: {purged.conversations} conversations, {purged.messages} messages, "
            f"{purged.events} stored events, {purged.buffers} Redis buffers, "
            f"{purged.cached_answers} cached answers purged"
        )
