from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.models import ApiKey
from apps.accounts.selectors import team_get_by_name
from apps.core.audit import Actor
from apps.usage.models import Limit
from apps.usage.services import limit_save

FIELDS = {
    "burst": "burst_tokens",
    "tokens_per_minute": "tokens_per_minute",
    "daily": "daily_tokens",
    "monthly": "monthly_tokens",
    "max_concurrent": "max_concurrent_streams",
    "max_tokens": "max_tokens",
    "requests_per_second": "requests_per_second",
    "request_burst": "request_burst",
}
# The team's requests: empty is the deployment's default, not unlimited.
REQUEST_FIELDS = {
    "requests_per_second": "REQUEST_RATE_PER_SECOND",
    "request_burst": "REQUEST_BURST",
}


class Command(BaseCommand):
    help = (
        "Set a team's (or one key's) token limits, and a team's request rate; without "
        "values, print them. Give none to remove a limit (unlimited; for the request "
        "rate, the default)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True)
        parser.add_argument("--key", help="public prefix of one of the team's API keys")
        for option in FIELDS:
            parser.add_argument(f"--{option.replace('_', '-')}", type=_tokens, metavar="N|none")
        parser.add_argument(
            "--models",
            metavar="ALIAS,…|none",
            help="the model aliases it may use, comma-separated; none: any",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        team = team_get_by_name(name=options["team"])
        if team is None:
            raise CommandError(f"no team named {options['team']!r}")
        api_key = None
        if options["key"]:
            api_key = ApiKey.objects.filter(team=team, prefix=options["key"]).first()
            if api_key is None:
                raise CommandError(f"team {team.name!r} has no key {options['key']!r}")
        given = {FIELDS[o]: options[o] for o in FIELDS if options[o] is not None}
        if options["models"] is not None:
            given["allowed_models"] = _aliases(options["models"])
        if api_key is not None and given.keys() & REQUEST_FIELDS.keys():
            raise CommandError("request rates are the team's: leave out --key")
        limit = Limit.objects.filter(team=team, api_key=api_key).first()
        if given:
            limit = limit or Limit(team=team, api_key=api_key)
            for field, value in given.items():
                setattr(limit, field, None if value == "none" else value)
            limit_save(limit=limit, actor=Actor.command("setlimits"))
        scope = f"key {api_key.prefix}" if api_key else f"team {team.name}"
        if limit is None:
            self.stdout.write(f"{scope}: unlimited")
            return
        allowed = "any" if limit.allowed_models is None else ",".join(limit.allowed_models)
        self.stdout.write(f"{scope}: models = {allowed}")
        for option, field in FIELDS.items():
            if api_key is not None and field in REQUEST_FIELDS:
                continue
            value = getattr(limit, field)
            if value is None and field in REQUEST_FIELDS:
                value = f"default ({getattr(settings, REQUEST_FIELDS[field])})"
            self.stdout.write(f"{scope}: {option} = {'unlimited' if value is None else value}")


def _aliases(value: str) -> list[str] | str:
    if value == "none":
        return value
    names = [name.strip() for name in value.split(",") if name.strip()]
    known = set(settings.INFERENCE_MODELS or settings.MODEL_ALIASES)
    unknown = sorted(set(names) - known)
    if unknown:
        raise CommandError(f"no model alias {unknown}; choose from {sorted(known)}")
    return names


def _tokens(value: str) -> int | str:
    if value == "none":
        return value
    if not value.isdigit():
        raise ValueError(value)
    return int(value)
