"""Functions in pipeline/ and stages/ stay short enough to read in one screen.

A function's length is its lines from `def` (decorators excluded) to its last line,
nested functions and classes included: a route table written as closures is as long to
read as the closures together. The files are parsed, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages")
MAX_FUNCTION_LINES = 50


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function in `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, node.lineno, lines))
    return found


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def test_the_measure_counts_every_line_of_a_function():
    # def line + 49 body lines = 50: allowed; one more is not.
    assert long_functions(_function("fits", 49)) == []
    assert long_functions(_function("too_long", 50)) == [("too_long", 1, 51)]
    # async functions and methods count too; a long inner function is flagged on its own
    # and makes its parent long as well.
    method = "class C:\n" + _function("method", 60, indent="    ")
    assert long_functions(method) == [("method", 2, 61)]
    assert long_functions("async " + _function("handler", 55)) == [("handler", 1, 56)]
    outer = "def outer():\n" + _function("inner", 50, indent="    ") + "    return inner\n"
    assert sorted(long_functions(outer)) == [("inner", 2, 51), ("outer", 1, 53)]


def test_no_function_in_the_engine_or_its_stages_is_over_50_lines():
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50, "the packages were not found where the test looks for them"
    too_long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({lines} lines)"
        for path in files
        for name, line, lines in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not too_long, (
        f"functions over {MAX_FUNCTION_LINES} lines (split each into named parts): "
        + "; ".join(too_long)
    )
