from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.models import ApiKey
from apps.accounts.selectors import team_get_by_name
from apps.core.audit import Actor
from apps.core.exceptions import InvalidRequest
from apps.core.tags import tag_check
from apps.usage.limits import aliases_unknown, model_aliases
from apps.usage.models import Limit
from apps.usage.services import limit_save

FIELDS = {
    "burst": "burst_tokens",
    "tokens_per_minute": "tokens_per_minute",
    "daily": "daily_tokens",
    "monthly": "monthly_tokens",
    "daily_usd": "daily_usd",
    "monthly_usd": "monthly_usd",
    "max_concurrent": "max_concurrent_streams",
    "max_tokens": "max_tokens",
    "requests_per_second": "requests_per_second",
    "request_burst": "request_burst",
}
MONEY = {"daily_usd", "monthly_usd"}
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
        parser.add_argument("--tag", help="a purpose tag: the team's limits of requests under it")
        for option in FIELDS:
            kind, metavar = (_dollars, "USD|none") if option in MONEY else (_tokens, "N|none")
            parser.add_argument(f"--{option.replace('_', '-')}", type=kind, metavar=metavar)
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
        tag = _tag(options["tag"])
        if tag and api_key is not None:
            raise CommandError("a tag's limits are the team's: give --tag or --key, not both")
        given = {FIELDS[o]: options[o] for o in FIELDS if options[o] is not None}
        if options["models"] is not None:
            given["allowed_models"] = _aliases(options["models"])
        if (api_key is not None or tag) and given.keys() & REQUEST_FIELDS.keys():
            raise CommandError("request rates are the team's: leave out --key and --tag")
        limit = Limit.objects.filter(team=team, api_key=api_key, tag=tag).first()
        if given:
            limit = limit or Limit(team=team, api_key=api_key, tag=tag)
            for field, value in given.items():
                setattr(limit, field, None if value == "none" else value)
            limit_save(limit=limit, actor=Actor.command("setlimits"))
        scope = f"key {api_key.prefix}" if api_key else f"team {team.name}"
        scope += f" tag {tag}" if tag else ""
        if limit is None:
            self.stdout.write(f"{scope}: unlimited")
            return
        allowed = "any" if limit.allowed_models is None else ",".join(limit.allowed_models)
        self.stdout.write(f"{scope}: models = {allowed}")
        for option, field in FIELDS.items():
            if (api_key is not None or tag) and field in REQUEST_FIELDS:
                continue
            value = getattr(limit, field)
            if value is None and field in REQUEST_FIELDS:
                value = f"default ({getattr(settings, REQUEST_FIELDS[field])})"
            self.stdout.write(f"{scope}: {option} = {'unlimited' if value is None else value}")


def _aliases(value: str) -> list[str] | str:
    if value == "none":
        return value
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = aliases_unknown(names)
    if unknown:
        raise CommandError(f"no model alias {unknown}; choose from {model_aliases()}")
    return names


def _tag(value: str | None) -> str:
    try:
        return tag_check(value, param="--tag") if value else ""
    except InvalidRequest as exc:
        raise CommandError(str(exc)) from exc


def _dollars(value: str) -> Decimal | str:
    if value == "none":
        return value
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:
        raise ValueError(value) from exc
    if not amount.is_finite() or amount < 0:
        raise ValueError(value)
    return amount


def _tokens(value: str) -> int | str:
    if value == "none":
        return value
    if not value.isdigit():
        raise ValueError(value)
    return int(value)
