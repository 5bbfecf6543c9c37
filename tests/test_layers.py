"""Imports between the apps point down only: site → chat → knowledge → usage → accounts →
core, the kernel every app uses. A lower app that must tell a higher one something sends a
signal (``apps/knowledge/signals.py``); a higher app extends a lower one's admin."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from config.env import BASE_DIR

LAYERS = ["core", "accounts", "usage", "knowledge", "chat", "site"]
"""Bottom first: each app may import itself and those before it."""

TEAM_SCOPED = {"core": {"accounts"}}
"""The kernel's rows (idempotency keys, audit events, cached answers) belong to a team: core
refers to ``accounts.Team``, and to nothing else of the apps."""


def apps_imported(path: Path) -> Iterator[str]:
    """The app of every ``apps.<app>`` module the file imports, lazily or not."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "apps" and len(parts) > 1:
                yield parts[1]


def test_every_app_has_a_layer() -> None:
    assert {p.parent.name for p in (BASE_DIR / "apps").glob("*/apps.py")} == set(LAYERS)


@pytest.mark.parametrize("app", LAYERS)
def test_an_app_imports_only_the_apps_below_it(app: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(app) + 1]) | TEAM_SCOPED.get(app, set())
    upward = sorted(
        f"{path.relative_to(BASE_DIR)} imports apps.{imported}"
        for path in (BASE_DIR / "apps" / app).rglob("*.py")
        for imported in apps_imported(path)
        if imported not in allowed
    )
    assert upward == []
