"""Only what the engine and the checkpoint can run: a plan row needing an MTP head the
checkpoint lacks, or an online FP8 load the cards cannot hold with no FP8 checkpoint to
serve instead, is ruled out with its reason; scripts serve a published FP8 checkpoint
where the BF16 weights do not fit while loading; no FastDeploy script for a model it does
not serve."""

from __future__ import annotations

from omegaconf import OmegaConf

from pipeline.config.checkpoint_rules import fp8_load
from pipeline.deploy import write_deploy
from pipeline.deploy.settings import deployment
from pipeline.plan.capability import capability_rule
from tests.helpers import make_config

SIM = ["executor=simulated", "max_model_len=4096", "block_size=128"]


def resolved(*overrides: str) -> dict:
    return OmegaConf.to_container(make_config([*SIM, *overrides]), resolve=True)


def test_mtp_needs_the_checkpoints_mtp_layers():
    qwen = make_config([*SIM, "hardware=h200", "model=spec/qwen3_235b_a22b", "tp=8",
                        "speculative.method=mtp"])  # fmt: skip
    assert capability_rule(qwen).startswith(
        "speculative.method=mtp: Qwen3-235B-A22B has no MTP layers"
    )
    ernie = make_config([*SIM, "hardware=h100", "model=spec/ernie45_21b_a3b",
                         "speculative.method=mtp"])  # fmt: skip
    assert capability_rule(ernie) == ""
    assert capability_rule(make_config([*SIM, "hardware=h200", "model=spec/qwen3_235b_a22b",
                                        "tp=8"])) == ""  # fmt: skip


def test_online_fp8_only_where_the_bf16_weights_fit_while_loading():
    # Qwen3-235B-A22B: about 235e9 parameters x 2 bytes over tp=2 is ~235 GB a card, past an
    # H200's 141 GB; Qwen publishes Qwen/Qwen3-235B-A22B-FP8: the scripts serve that
    big = resolved("hardware=h200", "model=spec/qwen3_235b_a22b", "tp=2", "quantization=fp8")
    load = fp8_load(big)
    assert load is not None and not load.fits and 220e9 < load.bf16_per_card < 250e9
    d = deployment(big, 1000, origin="a test")
    assert d.model == "Qwen/Qwen3-235B-A22B-FP8" and d.prequantized
    assert "published FP8 checkpoint Qwen/Qwen3-235B-A22B-FP8" in d.origin
    # Qwen3-30B-A3B at tp=1 on an H100: ~61 GB of BF16 fits 80 GB, online FP8 stays
    small = resolved("hardware=h100", "model=spec/qwen3_30b_a3b", "quantization=fp8")
    assert fp8_load(small).fits and deployment(small, 1000, origin="t").model == "Qwen3-30B-A3B"
    # no FP8 checkpoint published: the row is ruled out
    llama = make_config([*SIM, "hardware=h100", "model=spec/llama31_70b", "tp=1",
                         "quantization=fp8"])  # fmt: skip
    assert capability_rule(llama).startswith("quantization=fp8: online FP8 reads Llama-3.1-70B")


def test_the_fp8_checkpoint_script_has_no_quantization_flag(tmp_path):
    big = resolved("hardware=h200", "model=spec/qwen3_235b_a22b", "tp=2", "quantization=fp8")
    write_deploy(deployment(big, 1000, origin="a test"), [], tmp_path)
    vllm = (tmp_path / "vllm-cuda.sh").read_text()
    assert "vllm serve Qwen/Qwen3-235B-A22B-FP8" in vllm and "--quantization" not in vllm


def test_no_fastdeploy_script_for_a_model_it_does_not_serve(tmp_path):
    for device, script in (("h100", "fastdeploy-gpu.sh"), ("gaudi2", "fastdeploy-hpu.sh")):
        llama = resolved(f"hardware={device}", "model=spec/llama31_8b")
        names = [p.name for p in write_deploy(deployment(llama, 1000, origin="t"), [],
                                              tmp_path / device)]  # fmt: skip
        assert script not in names and len(names) >= 2  # the other engines' scripts stay
        ernie = resolved(f"hardware={device}", "model=spec/ernie45_21b_a3b")
        names = [p.name for p in write_deploy(deployment(ernie, 1000, origin="t"), [],
                                              tmp_path / f"{device}-ernie")]  # fmt: skip
        assert script in names
