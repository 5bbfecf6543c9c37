"""The shape of the code, measured the same way each time (issue 28's before and after).

What is printed
    modules     lines per module of the library (``apps/``, ``config/``, ``inference/``,
                ``retrieval/``; not migrations): median, p90, max, and those past 400
    functions   the ten longest functions and methods (lines, decorators excluded), and
                how many exceed 60
    arrows      imports that point up the layers: ``config`` on top, then the apps from
                ``site`` down to ``core``, then the libraries (``inference``,
                ``retrieval``), which import neither Django code nor each other; the one
                allowed exception is ``core`` → ``accounts`` (team-scoped rows)
    cycles      import cycles between modules (strongly connected components), every
                import counted, lazy ones included, ``TYPE_CHECKING`` ones not
    mypy        the share of library lines in files that ``[tool.mypy]`` checks strictly
    ignores     ``type: ignore`` comments, and those without an error code

Run
    .venv/bin/python bench/structure.py
"""

from __future__ import annotations

import ast
import re
import statistics
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("apps", "config", "inference", "retrieval")
LAYERS = [
    "retrieval",
    "inference",
    "apps.core",
    "apps.accounts",
    "apps.usage",
    "apps.knowledge",
    "apps.chat",
    "apps.site",
    "config",
]
"""Bottom first. The two libraries share a level: neither may import the other."""
ALLOWED_UP = {("apps.core", "apps.accounts")}


def library_files() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    return max(
        (layer for layer in LAYERS if module == layer or module.startswith(layer + ".")),
        key=len,
        default=None,
    )


def level(layer: str) -> int:
    return 0 if layer in ("retrieval", "inference") else LAYERS.index(layer) - 1


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return hidden


def imports(path: Path, modules: set[str]) -> Iterator[str]:
    """The library modules the file imports (the longest known prefix of each name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = _type_checking_nodes(tree)
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules and candidate != own:
                    yield candidate
                    break


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def functions(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            yield node.end_lineno - node.lineno + 1, f"{module_name(path)}.{node.name}"


def strict_files() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    if not config.get("strict"):
        return []
    return [
        path for path in library_files() for f in config["files"] if path.is_relative_to(ROOT / f)
    ]


def main() -> None:
    files = library_files()
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in files}
    ordered = sorted(sizes.values())
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    largest = max(sizes, key=lambda p: sizes[p])
    print(
        f"modules: {len(files)}, {sum(ordered)} lines; median {statistics.median(ordered):.0f}, "
        f"p90 {p90}, max {sizes[largest]} ({largest.relative_to(ROOT)})"
    )
    for path in sorted(files, key=lambda p: -sizes[p]):
        if sizes[path] > 400:
            print(f"  over 400: {sizes[path]:5d}  {path.relative_to(ROOT)}")

    lengths = sorted((item for path in files for item in functions(path)), reverse=True)
    print(f"functions: {len(lengths)}; over 60 lines: {sum(1 for n, _ in lengths if n > 60)}")
    for n, name in lengths[:10]:
        print(f"  {n:4d}  {name}")

    modules = {module_name(path): path for path in files}
    graph = {name: set(imports(path, set(modules))) for name, path in modules.items()}
    upward = []
    for name, targets in sorted(graph.items()):
        mine = layer_of(name)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is None or theirs is None or mine == theirs:
                continue
            same_level_libraries = level(mine) == level(theirs) == 0
            if (level(theirs) > level(mine) or same_level_libraries) and (
                (mine, theirs) not in ALLOWED_UP
            ):
                upward.append(f"{name} -> {target}")
    print(f"arrows pointing up: {len(upward)}")
    for arrow in upward:
        print(f"  {arrow}")
    found = cycles(graph)
    print(f"import cycles: {len(found)}")
    for component in found:
        print(f"  {' <-> '.join(component)}")

    strict = strict_files()
    share = sum(sizes[p] for p in strict) / sum(ordered)
    print(f"mypy strict: {sum(sizes[p] for p in strict)} of {sum(ordered)} lines ({share:.0%})")
    text = {path: path.read_text(encoding="utf-8") for path in files}
    ignores = sum(t.count("type: ignore") for t in text.values())
    bare = sum(len(re.findall(r"type: ignore(?!\[)", t)) for t in text.values())
    print(f"type: ignore: {ignores} ({bare} without an error code)")


if __name__ == "__main__":
    main()
