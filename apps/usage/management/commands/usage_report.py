from __future__ import annotations

import csv
from datetime import date
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.accounts.selectors import team_get_by_name
from apps.usage.selectors import GROUPS, usage_report
from apps.usage.services import alias_price

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
    help = (
        "Print a team's token usage (the same figures as GET /api/v1/usage), and what it "
        "would have cost had every answer been served by ROUTER_COUNTERFACTUAL_ALIAS "
        "(always_<alias>_usd: the same tokens at that alias's price)."
    )

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
        alias = settings.ROUTER_COUNTERFACTUAL_ALIAS
        report = usage_report(
            team=team,
            start=options["since"],
            end=end,
            group_by=options["group_by"],
            counterfactual=alias_price(alias),
        )
        always = f"always_{alias}_usd"
        columns = (*COLUMNS, always)
        rows = [
            {**row, always: row["counterfactual_usd"]}
            for row in [*report["data"], {**report["total"], "group": "total"}]
        ]
        if options["csv"]:
            writer = csv.DictWriter(self.stdout, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            return
        self._table(columns, rows)

    def _table(self, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
        cells = [[str(row[c]) if row[c] is not None else "-" for c in columns] for row in rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        self.stdout.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
        for row in cells:
            self.stdout.write("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
