"""Planning for a workload config: served on the simulated device, then planned."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.buckets import main
from tests.helpers import SMALL


def test_neither_a_folder_nor_a_workload_is_one_line(tmp_path, capsys):
    assert main(["plan", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("Error: give a run or sweep folder")


@pytest.mark.slow
def test_a_plan_serves_its_workload_and_another_seed_without_a_miss_or_compile(tmp_path):
    """Planned from one seed's steps, served warmed on that seed and the next: the served
    runs' own metrics show no miss and no compile while serving (the report's figures)."""
    workload = [*SMALL, "workload.num_requests=12", "workload.rate=50", "max_num_seqs=4"]
    assert main(["plan", "--workload", *workload, "--max-shapes", "40",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    assert (tmp_path / "simulated-run" / "steps.jsonl").stat().st_size > 0
    planned = yaml.safe_load((tmp_path / "buckets" / "planned.yaml").read_text())
    assert all(v["sizes"] == sorted(v["sizes"]) for v in planned["metadata"].values())
    for label in ("same", "seed1"):
        metrics = json.loads((tmp_path / f"served-{label}" / "metrics.json").read_text())
        assert metrics["num_requests"] == 12 and metrics["num_errors"] == 0
        assert metrics["bucket_misses"] == 0 and metrics["serving_compiles"] == 0
        assert 0 < metrics["warmup_shapes"] <= 40
    runs = [tmp_path / "served-same", tmp_path / "served-seed1"]
    prompts = [[json.loads(line)["prompt"] for line in open(r / "generations.jsonl")] for r in runs]
    assert prompts[0] != prompts[1]  # the second seed is another workload
    report = (tmp_path / "report.md").read_text()
    chosen = report.split("The recommended set is `")[1].split("`")[0]
    plan_row = next(line for line in report.splitlines()
                    if line.startswith(f"| {chosen} |"))  # fmt: skip
    assert [cell.strip() for cell in plan_row.split("|")[6:8]] == ["0", "0"]


@pytest.mark.slow
def test_a_prefix_sharing_plan_serves_rows_listing_more_blocks_than_the_pool(tmp_path):
    """Rows sharing a cached prefix list its blocks once each: decode steps list more
    blocks than the pool holds, and the plan (ending at what the config can produce, not
    at the pool) serves its workload and another seed warmed, with no miss or compile."""
    pool = 40
    workload = ["block_size=16", "max_model_len=256", "max_num_seqs=8", "prefix_caching=true",
                f"num_blocks={pool}", "workload.num_requests=16",
                "workload.shared_prefix_tokens=100", "workload.min_prompt_tokens=10",
                "workload.max_prompt_tokens=30", "workload.min_new_tokens=40",
                "workload.max_new_tokens=60"]  # fmt: skip
    assert main(["plan", "--workload", *workload, "--max-shapes", "60",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    planned = yaml.safe_load((tmp_path / "buckets" / "planned.yaml").read_text())
    assert planned["metadata"]["decode_blocks"]["sizes"][-1] == 8 * 16  # rows x a full row
    for label in ("same", "seed1"):
        folder = tmp_path / f"served-{label}"
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["num_errors"] == 0 and metrics["prefix_cache_hit_rate"] > 0
        assert metrics["bucket_misses"] == 0 and metrics["serving_compiles"] == 0
        listed = [json.loads(line)["needed"].get("decode", [0, 0])[1]
                  for line in open(folder / "steps.jsonl")]  # fmt: skip
        assert max(listed) > pool
