"""Every benchmark module imports with the project's own dependencies alone: the optional
peers (torch, transformers, accelerate, pyinstrument) are imported inside the functions that
use them, so `benchmarks/` stays importable on a fresh machine."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO

OPTIONAL = ["torch", "transformers", "accelerate", "pyinstrument"]
MODULES = sorted(f"benchmarks.{path.stem}" for path in (REPO / "benchmarks").glob("*.py"))

# A fresh interpreter, so a module another test imported earlier cannot hide an eager import.
PROBE = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def test_benchmark_modules_import_no_optional_package() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(MODULES), json.dumps(OPTIONAL)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(MODULES) > 10
    assert json.loads(done.stdout.splitlines()[-1]) == []
