from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from apps.accounts.models import Membership
from apps.accounts.services import api_key_create, membership_add, team_bootstrap
from apps.site.management.commands.runstack import local_engine

DEMO_TEAM = "demo"
DEMO_COLLECTION = "ragtier-docs"
ADMIN_USERNAME = "admin"


class Command(BaseCommand):
    help = (
        "Idempotent first-run setup: a demo team, an admin user and an API key (each secret "
        "printed once, when created) and the demo corpus ingested."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--corpus", default=str(settings.BASE_DIR / "demo" / "corpus"))

    def handle(self, *args: Any, **options: Any) -> None:
        team, _ = team_bootstrap(name=DEMO_TEAM)
        users = get_user_model().objects
        admin = users.filter(username=ADMIN_USERNAME).first()
        if admin is None:
            password = secrets.token_urlsafe(12)
            admin = users.create_superuser(ADMIN_USERNAME, "", password)
            self._say(f"admin user   {ADMIN_USERNAME} / {password}   (shown once)")
        membership_add(team=team, user=admin, role=Membership.Role.OWNER)
        if not team.api_keys.exists():
            issued = api_key_create(team=team, name="demo")
            self._say(f"demo API key {issued.secret}   (shown once)")
        with local_engine():  # the engine, where the index lives in one runstack starts
            call_command(
                "ingest",
                options["corpus"],
                team=DEMO_TEAM,
                collection=DEMO_COLLECTION,
                stdout=self.stdout,
                stderr=self.stderr,
            )

    def _say(self, line: str) -> None:
        self.stdout.write(self.style.SUCCESS(line))
