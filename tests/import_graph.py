"""The import graph of the library, read from the source with ``ast``: what
``tests/test_layers.py`` checks and ``bench/structure.py`` measures."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from config.env import BASE_DIR

PACKAGES = ("apps", "config", "inference", "retrieval")
"""The library: what the layers order and the graph covers."""


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
