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
                import counted, lazy ones included, ``TYPE_CHECKING`` ones not (the graph
                of ``tests/import_graph.py``, which ``tests/test_layers.py`` checks)
    mypy        the share of library lines in files that ``[tool.mypy]`` checks strictly
    ignores     ``type: ignore`` comments, and those without an error code

Run
    .venv/bin/python bench/structure.py
"""

from __future__ import annotations

import ast
import re
import statistics
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as ``python bench/structure.py``
    sys.path.insert(0, str(ROOT))

from tests.import_graph import (  # noqa: E402
    PACKAGES,
    cycles,
    import_graph,
    module_name,
    python_files,
)

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


def layer_of(module: str) -> str | None:
    return max(
        (layer for layer in LAYERS if module == layer or module.startswith(layer + ".")),
        key=len,
        default=None,
    )


def level(layer: str) -> int:
    return 0 if layer in ("retrieval", "inference") else LAYERS.index(layer) - 1


def library_files() -> list[Path]:
    return python_files(*PACKAGES)


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

    graph = import_graph()
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
