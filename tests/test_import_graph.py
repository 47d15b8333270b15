"""No import circle among the modules of pipeline/ and stages/.

Every import counts, also one made only for the type checker (under TYPE_CHECKING) or inside
a function (to load something late): each still means one module cannot be read, moved or
tested without the other. The files are parsed, not imported.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages")

# Circles allowed: none. A module that joins or forms one fails here.
KNOWN_CIRCLES: list[set[str]] = []


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its __init__)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _named(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement reads: a module, or a name from a module."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the module's own package, up level - 1 more
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [base])])
    yield from (f"{base}.{alias.name}" for alias in node.names)


def imports_of(module: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """The known modules `source` imports anywhere in it: for each name, the longest known
    module it starts with (`from stages.scheduling import request` is
    stages.scheduling.request; a class from a module is that module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name in _named(node, module, is_package):
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


@functools.cache
def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), known, path.stem == "__init__")
        for name, path in files.items()
    }


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.add(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(part)
    return found


def test_the_finder_sees_circles_through_any_import():
    graph = {
        name: imports_of(name, source, {"p.a", "p.b", "p.c", "p.d"})
        for name, source in {
            "p.a": "from p.b import X\n",
            "p.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n",
            "p.c": "def f():\n    from p.d import Y\n",
            "p.d": "import p.c\n",
        }.items()
    }
    assert graph == {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.d"}, "p.d": {"p.c"}}
    assert sorted(map(sorted, circles(graph))) == [["p.a", "p.b"], ["p.c", "p.d"]]
    assert circles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set()}) == []


def test_relative_imports_resolve_from_their_package():
    known = {"p", "p.a", "p.b"}
    assert imports_of("p.a", "from . import b\nfrom .b import X\n", known) == {"p.b"}
    assert imports_of("p", "from .a import X\n", known, is_package=True) == {"p.a"}


def test_no_new_import_circle_in_the_engine_or_its_stages():
    graph = import_graph()
    assert len(graph) > 50, "the packages were not found where the test looks for them"
    new = [
        sorted(part) for part in circles(graph) if not any(part <= known for known in KNOWN_CIRCLES)
    ]
    assert not new, f"import circles (break each; see KNOWN_CIRCLES): {new}"


def test_the_scheduler_and_the_executors_are_in_no_circle():
    graph = import_graph()
    mine = {
        "stages.scheduling.scheduler",
        "stages.scheduling.decode_runs",
        "stages.scheduling.step_rows",
        "pipeline.job.engine",
    }
    mine |= {
        "stages.scheduling.request",
        "stages.forward.forward_meta",
        "stages.forward.step_shape",
        "stages.forward.metadata",
    }
    mine |= {name for name in graph if name.startswith(("pipeline.executors", "stages.simulator"))}
    caught = [sorted(part & mine) for part in circles(graph) if part & mine]
    assert not caught, f"in an import circle: {caught}"
