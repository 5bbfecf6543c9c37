from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Team
from apps.accounts.services import IssuedKey, api_key_create
from tests import factories

REAL_EMBEDDER = "retrieval.embedders.SentenceTransformerEmbedder"


@pytest.fixture(autouse=True)
def _data_dir(settings: Any, tmp_path: Path) -> None:
    """Each test gets its own index and upload folders."""
    settings.INDEX_DIR = tmp_path / "indexes"
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture
def team(db: None) -> Team:
    return factories.team(name="acme")


@pytest.fixture
def other_team(db: None) -> Team:
    return factories.team(name="globex")


@pytest.fixture
def issued_key(team: Team) -> IssuedKey:
    return api_key_create(team=team, name="test")


def client_for(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def api(issued_key: IssuedKey) -> APIClient:
    """An API client with a full-scope key of ``team``."""
    return client_for(issued_key.secret)


@pytest.fixture
def api_as(db: None) -> Callable[..., APIClient]:
    """A client for any team and scopes: ``api_as(team, scopes=["read"])``."""

    def make(team: Team, scopes: list[str] | None = None) -> APIClient:
        return client_for(api_key_create(team=team, scopes=scopes).secret)

    return make


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks: Any) -> Iterator[None]:
    """Run on-commit work (ingestion is queued on commit) inside the test transaction."""
    with django_capture_on_commit_callbacks(execute=True):
        yield


@pytest.fixture
def real_embedder(settings: Any) -> None:
    """The real all-MiniLM-L6-v2 from its package folder, instead of the fake."""
    settings.EMBEDDER_BACKEND = REAL_EMBEDDER
    settings.EMBEDDER_OPTIONS = {"model_path": None, "device": "auto"}
