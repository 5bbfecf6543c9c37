"""``setupdemo``: the first-run setup ``make run`` calls each time, so it must be
idempotent: secrets printed once, when made, and a rerun ingests nothing twice."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.accounts.models import Membership, Team
from apps.knowledge.models import Document

pytestmark = pytest.mark.django_db


def test_setupdemo_makes_the_demo_once(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"  # a folder of its own: the data dir may be tmp_path
    corpus.mkdir()
    (corpus / "pantry.md").write_text("# Pantry\n\nThe spare key hangs by the door.\n")
    first, again = StringIO(), StringIO()
    call_command("setupdemo", corpus=str(corpus), stdout=first, stderr=StringIO())
    call_command("setupdemo", corpus=str(corpus), stdout=again, stderr=StringIO())

    assert first.getvalue().count("(shown once)") == 2  # the admin's password, the key
    assert "(shown once)" not in again.getvalue()
    assert first.getvalue().endswith("ragtier-docs: 1 indexed\n")
    assert again.getvalue() == "ragtier-docs: 1 existing\n"
    team = Team.objects.get(name="demo")
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser
    assert team.memberships.get(user=admin).role == Membership.Role.OWNER
    assert team.api_keys.count() == 1
    assert Document.objects.filter(collection__team=team, status="indexed").count() == 1
