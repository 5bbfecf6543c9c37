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

import ast
from functools import cache
from pathlib import Path

import pytest

from config.env import BASE_DIR

LAYERS = ["core", "accounts", "usage", "knowledge", "chat", "site"]
"""Bottom first: each app may import itself and those before it."""

TEAM_SCOPED = {"core": {"accounts"}}
"""The kernel's rows (idempotency keys, audit events, cached answers) belong to a team: core
refers to ``accounts.Team``, and to nothing else of the apps."""

LIBRARIES = ("inference", "retrieval")
PACKAGES = ("apps", "config", *LIBRARIES)
FRAMEWORKS = ("django", "rest_framework", "apps", "config", "bench")
"""What a library never imports (besides the other library)."""


def python_files(*roots: str) -> list[Path]:
    return sorted(
        path
        for root in roots
        for path in (BASE_DIR / root).rglob("*.py")
        if "migrations" not in path.parts and ".venv" not in path.parts
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(BASE_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return hidden


@cache
def imported_names(path: Path, *, type_checking: bool = True) -> tuple[str, ...]:
    """Every dotted name the file imports, relative imports made absolute; with
    ``from a import b``, both ``a`` and ``a.b`` (``b`` may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = set() if type_checking else _type_checking_only(tree)
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return tuple(names)


def top_levels(path: Path) -> set[str]:
    return {name.partition(".")[0] for name in imported_names(path)}


def app_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "apps" and len(parts) > 1 else None


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module → the library modules it imports (the longest known prefix of each name),
    ``TYPE_CHECKING`` imports left out."""
    modules = {module_name(path): path for path in python_files(*PACKAGES)}
    graph: dict[str, frozenset[str]] = {}
    for own, path in modules.items():
        targets: set[str] = set()
        for name in imported_names(path, type_checking=False):
            parts = name.split(".")
            known = (".".join(parts[:end]) for end in range(len(parts), 0, -1))
            found = next((m for m in known if m in modules), None)
            if found is not None and found != own:
                targets.add(found)
        graph[own] = frozenset(targets)
    return graph


def cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(graph):
        if root in index:
            continue
        visit(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    visit(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                    on_stack.discard(component[-1])
                if len(component) > 1:
                    found.append(sorted(component))
    return found


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
