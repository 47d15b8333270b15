"""Planning for a workload config: served on the simulated device, then planned."""

from __future__ import annotations

import yaml

from pipeline.buckets import main
from tests.helpers import SMALL


def test_a_workload_config_is_planned_from_its_simulated_steps(tmp_path, capsys):
    assert main(["plan", "--workload", *SMALL, "--max-shapes", "40", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "simulated-run" / "steps.jsonl").stat().st_size > 0
    planned = yaml.safe_load((tmp_path / "buckets" / "planned.yaml").read_text())
    sizes = planned["metadata"]
    assert all(values["sizes"] == sorted(values["sizes"]) for values in sizes.values())
    report = (tmp_path / "report.md").read_text()
    plan_row = next(line for line in report.splitlines() if line.startswith("| plan |"))
    assert plan_row.split("|")[6].strip() == "0"  # no misses on the workload it was planned on


def test_neither_a_folder_nor_a_workload_is_one_line(tmp_path, capsys):
    assert main(["plan", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("Error: give a run or sweep folder")
