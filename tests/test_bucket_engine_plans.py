"""`pipeline.buckets plan` in the engine's own terms: on a FastDeploy run its step
variables, each set served on the workload, the recommendation within the budget; on a
vllm-gaudi run a VLLM_BUCKETING_FROM_FILE file that vllm-gaudi's filters leave whole."""

from __future__ import annotations

import ast
import itertools
import json

import yaml

from pipeline.buckets import main
from stages.forward.engine_grids import FastDeploySteps, ServerLimits, fastdeploy_grid

# A burst FastDeploy's default grid serves with compiles: decode batches of 1 or 2 rows
# (BATCH_STEP_DECODE=4 warms 4, 8, ...), prompts past what a step warms.
FD = ["executor=simulated", "hardware=gaudi2", "model=spec/ernie45_21b_a3b", "engine=fastdeploy",
      "workload=synthetic", "workload.num_requests=24", "workload.rate=4",
      "workload.min_prompt_tokens=100", "workload.max_prompt_tokens=3000",
      "workload.min_new_tokens=4", "workload.max_new_tokens=64", "max_model_len=4096",
      "max_tokens=2048", "max_num_seqs=16"]  # fmt: skip
ENV = {"MAX_PREFILL_NUM": "max_prefill_num", "BATCH_STEP_PREFILL": "batch_step_prefill",
       "SEQUENCE_STEP_PREFILL": "sequence_step_prefill",
       "CONTEXT_BLOCK_STEP_PREFILL": "context_block_step_prefill",
       "BATCH_STEP_DECODE": "batch_step_decode", "BLOCK_STEP_DECODE": "block_step_decode",
       "HPU_WARMUP_MODEL_LEN": "warmup_model_len"}  # fmt: skip


def test_a_fastdeploy_plan_cuts_serving_compiles_within_the_budget(tmp_path):
    out = tmp_path / "plan"
    assert main(["plan", "--workload", *FD, "--max-shapes", "200", "--out", str(out)]) == 0
    choice = json.loads((out / "choice.json").read_text())
    sets = {s["set"]: s for s in choice["sets"]}
    chosen, defaults = sets[choice["recommended"]], sets["defaults"]
    # FastDeploy's defaults, served: more than the budget, and compiles while serving
    assert defaults["graphs"] > 200 and defaults["compiles"] > 0
    assert chosen["compiles"] < defaults["compiles"] and chosen["graphs"] <= 200
    # the file's variables, run again: the served run warms what the plan counted, within
    # the budget, and its forward passes are FastDeploy's loops for those variables
    exports = dict(
        line.removeprefix("export ").split("=")
        for line in (out / "fastdeploy-env.sh").read_text().splitlines()
        if "export" in line
    )
    steps = FastDeploySteps(**{ENV[k]: int(v) for k, v in exports.items()})
    assert {k: int(v) for k, v in chosen["env"].items()} == {k: int(v) for k, v in exports.items()}
    served = json.loads((out / "served-same" / "metrics.json").read_text())
    assert served["warmup_shapes"] == chosen["graphs"] <= 200
    assert served["serving_compiles"] == chosen["compiles"]
    limits = ServerLimits(128, 2048, 16, 4096, served["num_blocks"], True, True)
    assert fastdeploy_grid(steps, limits).runs >= served["warmup_shapes"]
    assert "FastDeploy's defaults: " in (out / "report.md").read_text()


def test_a_budget_no_fastdeploy_grid_fits_is_one_line(tmp_path, capsys):
    assert main(["plan", "--workload", *FD, "--max-shapes", "3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("Error: no FastDeploy step variables fit --max-shapes 3")


def test_a_vllm_gaudi_plan_writes_a_file_its_filters_keep_whole(tmp_path):
    vllm = [o.replace("engine=fastdeploy", "engine=vllm") for o in FD]
    assert main(["plan", "--workload", *vllm, "--max-shapes", "64", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "deploy" / "vllm-buckets.txt").read_text()
    buckets = []  # each line's lists multiplied out, as vllm-gaudi reads the file
    for line in text.splitlines():
        dims = [d if isinstance(d, list) else [d] for d in ast.literal_eval(line)]
        buckets += list(itertools.product(*dims))
    prompts = [b for b in buckets if b[1] > 1]
    assert prompts and all(n * q <= 2048 for n, q, _ in prompts)  # none dropped
    assert {q for _, q, c in prompts if c == 0} == {q for _, q, _ in prompts}  # fresh prompts
    # the recommended set's sizes, as the served plan ran them: its query sizes are the file's
    served = yaml.safe_load((tmp_path / "served-same" / "resolved_config.yaml").read_text())
    assert {q for _, q, _ in prompts} == set(served["metadata"]["prefill_seq"]["sizes"])
    script = (tmp_path / "deploy" / "vllm-gaudi.sh").read_text()
    assert "VLLM_BUCKETING_FROM_FILE" in script and "VLLM_BUCKETING_STRATEGY" not in script
    assert "## For vllm-gaudi" in (tmp_path / "report.md").read_text()
