from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Membership, Team
from apps.accounts.services import membership_add


@pytest.fixture
def owner(team: Team, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("olive", password="a-long-password-1")
    membership_add(team=team, user=user, role=Membership.Role.OWNER)
    return user


@pytest.fixture
def member(team: Team, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("mo", password="a-long-password-1")
    membership_add(team=team, user=user, role=Membership.Role.MEMBER)
    return user


def session_of(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client
