from __future__ import annotations

import csv
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.accounts.selectors import team_get_by_name
from apps.usage.selectors import GROUPS, usage_report

COLUMNS = (
    "group",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "total_tokens",
    "cost_usd",
    "energy_wh",
)


class Command(BaseCommand):
    help = "Print a team's token usage (the same figures as GET /api/v1/usage)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True)
        parser.add_argument(
            "--since", type=date.fromisoformat, required=True, help="first day, YYYY-MM-DD"
        )
        parser.add_argument("--until", type=date.fromisoformat, help="last day (default today)")
        parser.add_argument("--group-by", choices=list(GROUPS), default="day")
        parser.add_argument("--csv", action="store_true", help="CSV instead of a table")

    def handle(self, *args: Any, **options: Any) -> None:
        team = team_get_by_name(name=options["team"])
        if team is None:
            raise CommandError(f"no team named {options['team']!r}")
        end = options["until"] or timezone.localdate()
        if options["since"] > end:
            raise CommandError("--since is after --until")
        report = usage_report(
            team=team, start=options["since"], end=end, group_by=options["group_by"]
        )
        rows = [*report["data"], {**report["total"], "group": "total"}]
        if options["csv"]:
            writer = csv.DictWriter(self.stdout, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            return
        cells = [[str(row[c]) if row[c] is not None else "-" for c in COLUMNS] for row in rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
        self.stdout.write("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
        for row in cells:
            self.stdout.write("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
