"""Imports point down only, and never go round in a circle.

From the top: ``config`` (settings, urls, the ASGI and Celery entry points) may import
anything; then the apps, site → chat → knowledge → usage → accounts → core, the kernel
every app uses; then the libraries, ``inference`` and ``retrieval``, which import no
Django, no app, no ``config`` and not each other. Settings reach the apps and libraries
through ``django.conf.settings`` or as arguments, never by importing ``config``; the Celery
app through ``celery.current_app`` or ``shared_task``. ``bench/`` may import anything and
nothing imports it. A lower app that must tell a higher one something sends a signal
(``apps/knowledge/signals.py``); a higher app extends a lower one's admin.

Every import counts, lazy ones included. An import cycle between two modules (a strongly
connected component of the import graph) fails too, except through imports made only
under ``TYPE_CHECKING``, which never run."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.env import BASE_DIR
from tests.import_graph import PACKAGES, cycles, import_graph, imported_names, python_files

LAYERS = ["core", "accounts", "usage", "knowledge", "chat", "site"]
"""Bottom first: each app may import itself and those before it."""

TEAM_SCOPED = {"core": {"accounts"}}
"""The kernel's rows (idempotency keys, audit events, cached answers) belong to a team: core
refers to ``accounts.Team``, and to nothing else of the apps."""

LIBRARIES = ("inference", "retrieval")
FRAMEWORKS = ("django", "rest_framework", "apps", "config", "bench")
"""What a library never imports (besides the other library)."""


def top_levels(path: Path) -> set[str]:
    return {name.partition(".")[0] for name in imported_names(path)}


def app_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "apps" and len(parts) > 1 else None


def test_every_app_has_a_layer() -> None:
    assert {p.parent.name for p in (BASE_DIR / "apps").glob("*/apps.py")} == set(LAYERS)


@pytest.mark.parametrize("app", LAYERS)
def test_an_app_imports_only_the_apps_below_it(app: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(app) + 1]) | TEAM_SCOPED.get(app, set())
    upward = sorted(
        f"{path.relative_to(BASE_DIR)} imports apps.{imported}"
        for path in python_files(f"apps/{app}")
        for imported in {app_of(name) for name in imported_names(path)} - {None}
        if imported not in allowed
    )
    assert upward == []


@pytest.mark.parametrize("package", ["apps", *LIBRARIES])
def test_nothing_below_config_imports_it(package: str) -> None:
    upward = sorted(
        f"{path.relative_to(BASE_DIR)} imports {name}"
        for path in python_files(package)
        for name in imported_names(path)
        if name == "config" or name.startswith("config.")
    )
    assert upward == []


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_library_imports_no_framework_and_not_the_other_library(library: str) -> None:
    forbidden = {*FRAMEWORKS, *LIBRARIES} - {library}
    found = sorted(
        f"{path.relative_to(BASE_DIR)} imports {name}"
        for path in python_files(library)
        for name in top_levels(path) & forbidden
    )
    assert found == []


def test_nothing_imports_bench() -> None:
    found = sorted(
        f"{path.relative_to(BASE_DIR)} imports bench"
        for path in python_files(*PACKAGES, "tests")
        if "bench" in top_levels(path)
    )
    assert found == []


def test_no_import_cycles() -> None:
    assert [" <-> ".join(component) for component in cycles(import_graph())] == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a", "d"}),
        "d": frozenset(),
        "e": frozenset({"e"}),
    }
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_configured_celery_app_is_current() -> None:
    """Apps send tasks through ``celery.current_app``: importing the ``config`` package,
    as every process does to load its settings, makes the configured app current."""
    from celery._state import get_current_app

    from config.celery import app

    assert get_current_app() is app
