"""What you simulate is what you deploy: a run's scripts are its engine's, written from the
config the run resolved; the FastDeploy script states the run's own warmup figure and the
compiles it predicted while serving; engine=native says its scripts were not simulated."""

from __future__ import annotations

import json
import shlex

import pytest

from pipeline.deploy.settings import deployment
from stages.forward.engine_grids import (
    FastDeploySteps,
    ServerLimits,
    fastdeploy_warmup,
    part_graphs,
)
from tests.helpers import run_cli

RUN = ["executor=simulated", "hardware=gaudi2", "model=spec/ernie45_21b_a3b", "warmup=true",
       "workload=synthetic", "workload.num_requests=12", "workload.rate=4",
       "workload.min_prompt_tokens=200", "workload.max_prompt_tokens=3000",
       "workload.min_new_tokens=8", "workload.max_new_tokens=64", "max_model_len=4096",
       "max_tokens=1024", "max_num_seqs=8"]  # fmt: skip


def served(tmp_path, *extra: str):
    out = tmp_path / "run"
    done = run_cli(tmp_path, "pipeline", *RUN, *extra, f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    deploy = run_cli(tmp_path, "pipeline.deploy", out)
    assert deploy.returncode == 0, deploy.stderr[-2000:]
    return out, json.loads((out / "metrics.json").read_text()), deploy


def exports(script: str) -> dict[str, str]:
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in script.splitlines()
        if line.startswith("export ")
    )


def test_a_fastdeploy_run_deploys_fastdeploy_as_it_simulated_it(tmp_path):
    out, metrics, _ = served(tmp_path, "engine=fastdeploy", "block_size=64")
    assert sorted(p.name for p in (out / "deploy").iterdir()) == [
        "fastdeploy-hpu.sh", "overrides.txt"]  # fmt: skip
    script = (out / "deploy" / "fastdeploy-hpu.sh").read_text()
    env = exports(script)
    assert int(env["SEQUENCE_STEP_PREFILL"]) % 64 == 0
    assert "--block-size 64" in script
    # the one warmup figure: the run's count is FastDeploy's grid, listed independently
    steps = FastDeploySteps(sequence_step_prefill=64)
    limits = ServerLimits(64, 1024, 8, 4096, metrics["num_blocks"], True, True)
    recipes = sum(part_graphs(fastdeploy_warmup(steps, limits), whole=True).values())
    assert metrics["warmup_shapes"] == recipes
    assert f"# Warmup: {recipes:,} recipe sets" in script
    # HPU_WARMUP_MODEL_LEN (4096) is max_model_len here: nothing left to the model length;
    # the compiles the run predicted are stated
    compiles = metrics["serving_compiles"]
    if compiles:
        assert f"run predicted {compiles:,} shapes compiled while serving" in script


def test_a_short_warmup_model_len_states_the_compiles_it_leaves(tmp_path):
    out, metrics, _ = served(
        tmp_path, "engine=fastdeploy", "metadata.fastdeploy.warmup_model_len=1024"
    )
    script = (out / "deploy" / "fastdeploy-hpu.sh").read_text()
    assert exports(script)["HPU_WARMUP_MODEL_LEN"] == "1024"
    assert metrics["serving_compiles"] > 0  # 3,000-token prompts past the warmed 1,024
    assert (
        "HPU_WARMUP_MODEL_LEN=1024 < --max-model-len 4096" in script
        and f"the run predicted {metrics['serving_compiles']:,} shapes" in script
    )


def test_a_native_run_says_its_scripts_were_not_simulated(tmp_path):
    out, _, deploy = served(tmp_path)
    names = sorted(p.name for p in (out / "deploy").iterdir())
    assert names == ["fastdeploy-hpu.sh", "overrides.txt", "vllm-buckets.txt", "vllm-gaudi.sh"]
    for name in ("fastdeploy-hpu.sh", "vllm-gaudi.sh"):
        assert (
            "# NOT SIMULATED: the run predicted engine=native"
            in (out / "deploy" / name).read_text()
        )
    assert "engine=native" in deploy.stderr


def test_a_prefill_step_between_blocks_is_refused(tmp_path):
    step = "metadata.fastdeploy.sequence_step_prefill=64"
    done = run_cli(tmp_path, "pipeline", *RUN, "engine=fastdeploy", "block_size=128", step,
                   f"hydra.run.dir={tmp_path}/r")  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "sequence_step_prefill=64 is not a multiple of block_size=128" in last


def test_deploy_reads_the_resolved_config_not_the_defaults():
    # a config as the run resolved it: the script's values are its values
    config = {"scheduler": {"_target_": "x.ChunkedScheduler", "max_prefill_rows": 3},
              "metadata": {"bucketing": "fastdeploy", "step_recipes": True,
                           "fastdeploy": {"sequence_step_prefill": 256, "warmup_model_len": 8192},
                           **{a: {"min": 0, "step": 0, "max": 0, "sizes": []} for a in (
                               "prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch",
                               "decode_blocks")}},
              "block_size": 128, "max_tokens": 2048, "max_num_seqs": 16, "max_model_len": 8192,
              "model": {"name": "m"}, "engine": {"name": "fastdeploy"},
              "hardware": {"name": "gaudi2", "compile_s": 10}}  # fmt: skip
    d = deployment(config, 4000, origin="r", metrics={"warmup_shapes": 7, "serving_compiles": 2})
    assert d.engine == "fastdeploy" and d.fastdeploy.sequence_step_prefill == 256
    assert d.predicted is not None and d.predicted.warmup_graphs == 7
    assert shlex.quote("m") == d.model


def test_a_gpu_run_deploys_its_engine_only(tmp_path):
    from omegaconf import OmegaConf

    from pipeline.deploy import write_deploy
    from tests.helpers import make_config

    for engine, script in (("sglang", "sglang.sh"), ("trtllm", "trtllm.sh"),
                           ("vllm", "vllm-cuda.sh")):  # fmt: skip
        cfg = make_config(["executor=simulated", "hardware=h100", "model=spec/llama31_8b",
                           f"engine={engine}"])  # fmt: skip
        config = OmegaConf.to_container(cfg, resolve=True)
        written = write_deploy(deployment(config, 1000, origin="r"), [], tmp_path / engine)
        scripts = sorted(p.name for p in written if p.name.endswith(".sh"))
        assert scripts == [script]
        assert f"The run simulated this server (engine={engine})" in written[0].read_text()


def _products(text: str) -> list[tuple[int, int, int]]:
    """The buckets of a VLLM_BUCKETING_FROM_FILE file as vllm-gaudi reads them: each line a
    tuple whose list positions multiply out."""
    import ast
    import itertools

    out = []
    for line in text.splitlines():
        dims = [d if isinstance(d, list) else [d] for d in ast.literal_eval(line)]
        out += list(itertools.product(*dims))
    return out


def test_the_vllm_gaudi_file_is_in_its_own_axes():
    from omegaconf import OmegaConf

    from pipeline.deploy.hpu import vllm_buckets_file
    from tests.helpers import make_config

    cfg = make_config(["executor=simulated", "hardware=gaudi2", "model=spec/ernie45_21b_a3b",
                       "block_size=128", "max_tokens=1024", "max_model_len=4096",
                       "max_num_seqs=16", "metadata.bucketing=linear"])  # fmt: skip
    d = deployment(OmegaConf.to_container(cfg, resolve=True), 2000, origin="t")
    buckets = _products(vllm_buckets_file(d))
    prompts = [b for b in buckets if b[1] > 1]
    # none that vllm-gaudi would drop: batch x query within --max-num-batched-tokens
    assert prompts and all(n * q <= 1024 for n, q, _ in prompts)
    # a fresh prompt (no context) has its bucket at every query size
    assert {q for _, q, c in prompts if c == 0} == {q for _, q, _ in prompts}
    # a chunk of q tokens after c context blocks that our buckets hold (c + its blocks
    # within our largest table) has a context bucket at least c wide
    largest = max(d.buckets["prefill_blocks"])
    for q in {q for _, q, _ in prompts}:
        widest = max(c for _, qq, c in prompts if qq == q)
        assert widest == largest - q // 128
    assert any(q == 1 for _, q, _ in buckets)  # the decode buckets


def test_a_profile_of_an_older_release_says_its_scripts_are_the_current_ones(tmp_path):
    """engine=vllm_v0 predicts vLLM 0.6.3; the script it gets names current vLLM's flags,
    and says so instead of claiming the run simulated it."""
    from omegaconf import OmegaConf

    from pipeline.deploy import write_deploy
    from tests.helpers import make_config

    cfg = make_config(["executor=simulated", "hardware=h100", "model=spec/llama31_8b",
                       "engine=vllm_v0"])  # fmt: skip
    config = OmegaConf.to_container(cfg, resolve=True)
    (script,) = (p for p in write_deploy(deployment(config, 1000, origin="r"), [], tmp_path / "a")
                 if p.name.endswith(".sh"))  # fmt: skip
    text = script.read_text()
    assert script.name == "vllm-cuda.sh"
    assert "OLDER RELEASE: the run simulated vLLM 0.6.3's V0 engine (engine=vllm's" in text
    assert "The run simulated this server" not in text
    config["engine"]["release"] = "vLLM 0.6.3\nrm -rf ~"  # a folder edited by hand
    with pytest.raises(ValueError, match="engine.release .* holds a control character"):
        deployment(config, 1000, origin="r")
