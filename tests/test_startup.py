"""A simulated run needs no tensors: it must never import Paddle, whose import alone costs
a large share of a short simulated run's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

PROBE = """
import json, runpy, sys
sys.argv = ["pipeline", *sys.argv[1:]]
runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "paddle")))
"""


@pytest.mark.slow
def test_a_simulated_run_never_imports_paddle(tmp_path):
    overrides = [
        "executor=simulated",
        "hardware=h100",
        "model=spec/llama31_8b",
        "workload.num_requests=20",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *overrides],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "metrics.json").is_file()  # the run served its workload
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
