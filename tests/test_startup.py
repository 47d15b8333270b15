"""Paddle is loaded only once a run needs tensors: a simulated run never imports it, and
neither does `--help` or a config that fails its checks (Paddle's import alone costs a
large share of such a short start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

# Runs `python -m MODULE ARGS...` in this process, then prints its exit code and the Paddle
# modules it loaded as the last line of stdout.
PROBE = """
import json, runpy, sys
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as stop:
    code = stop.code or 0
paddle = sorted(m for m in sys.modules if m.split(".")[0] == "paddle")
print(json.dumps({"exit": code, "paddle": paddle}))
"""


def probe(module: str, args: list[str], cwd) -> tuple[dict, subprocess.CompletedProcess]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr  # the probe itself ran to its end
    return json.loads(result.stdout.strip().splitlines()[-1]), result


@pytest.mark.slow
def test_a_simulated_run_never_imports_paddle(tmp_path):
    overrides = [
        "executor=simulated",
        "hardware=h100",
        "model=spec/llama31_8b",
        "workload.num_requests=20",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    outcome, _ = probe("pipeline", overrides, tmp_path)
    assert outcome == {"exit": 0, "paddle": []}
    assert (tmp_path / "run" / "metrics.json").is_file()  # the run served its workload


# Each command's help, by a phrase of its own text (so the help itself was printed).
HELP = {
    "pipeline": "== Config groups (group=option) ==",
    "pipeline.serve": "an OpenAI-compatible HTTP server",
    "pipeline.calibrate": "fit the simulated device's cost model",
}


@pytest.mark.slow
@pytest.mark.parametrize("module", HELP)
def test_help_never_imports_paddle(tmp_path, module):
    outcome, result = probe(module, ["--help"], tmp_path)
    assert outcome == {"exit": 0, "paddle": []}
    assert HELP[module] in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("module", ["pipeline", "pipeline.serve"])
def test_a_config_error_never_imports_paddle(tmp_path, module):
    """The real executor (the default), so only the failed check keeps Paddle out."""
    run_dir = tmp_path / "run"
    outcome, result = probe(module, ["block_size=3", f"hydra.run.dir={run_dir}"], tmp_path)
    assert outcome == {"exit": 2, "paddle": []}
    assert result.stderr.strip().splitlines() == [
        "Error: block_size=3 is not a power of two: set block_size=16, 64 or 128"
    ]
