"""Layouts beyond tensor parallelism: the cards rule by hand, and each engine's rendered
commands for expert/data parallelism, disaggregated prefill/decode pools with their router,
and speculative decoding, against the flags as written here by hand from each engine's
documentation (the page is named beside each expectation)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.config.layout import Layout, layout_of
from pipeline.deploy import deployment, write_deploy
from tests.helpers import make_config
from tests.test_deploy_gpu import parse

MOE = ["executor=simulated", "model=spec/qwen3_30b_a3b", "max_model_len=4096",
       "max_num_seqs=64", "max_tokens=2048", "block_size=32"]  # fmt: skip


def config_of(overrides: list[str]) -> dict:
    cfg = make_config([*MOE, *overrides])
    return yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))


# FastDeploy's Intel Gaudi guide serves the ERNIE 4.5 series (conf/engine/fastdeploy.yaml)
ERNIE = "model=spec/ernie45_21b_a3b"


def export(tmp_path: Path, overrides: list[str], device: str = "h100") -> Path:
    config = config_of([f"hardware={device}", *overrides])
    out = tmp_path / "deploy"
    d = deployment(config, 1000, "org/m", origin="a test", replicas=2)
    write_deploy(d, [], out)
    return out


# ---- the cards rule, by hand -------------------------------------------------------------


@pytest.mark.parametrize(
    "layout, cards, scale",
    [
        (Layout(tp=1), 1, 1),
        (Layout(tp=2, ep=8, dp=4), 8, 4),  # 2 x 4 cards; 4 simulated replicas' capacity
        (Layout(tp=2, prefill=1, decode=3), 1 * 2 + 3 * 2, 1),  # pool tp 0 = tp
        (Layout(tp=2, prefill=2, decode=3, prefill_tp=1, decode_tp=4), 2 * 1 + 3 * 4, 1),
        # each instance takes its pool's tp x dp cards (a pool's dp 0 = dp)
        (Layout(tp=1, ep=2, dp=2, prefill=2, decode=3, decode_dp=4), 2 * 1 * 2 + 3 * 1 * 4, 1),
    ],
)
def test_cards_per_replica_by_hand(layout, cards, scale):
    assert layout.cards == cards
    assert layout.capacity_scale == scale


def test_the_layout_is_read_from_the_resolved_config():
    config = config_of(["hardware=h100", "tp=2", "disagg.prefill=1", "disagg.decode=2",
                        "disagg.decode_tp=4", "speculative.method=mtp",
                        "speculative.tokens=2"])  # fmt: skip
    layout = layout_of(config)
    assert layout.cards == 1 * 2 + 2 * 4
    assert layout.columns() == {"ep_dp": "-", "p_d": "1:2", "speculative": "mtp/2"}
    prefill, decode = layout.pools(2048, 64)
    assert (prefill.tp, prefill.max_tokens, decode.tp, decode.max_num_seqs) == (2, 2048, 4, 64)


def test_with_expert_parallelism_each_pool_splits_its_experts_over_its_own_cards():
    layout = Layout(tp=1, ep=2, dp=2, prefill=1, decode=1, prefill_tp=2, decode_dp=8)
    prefill, decode = layout.pools(2048, 64)
    assert (prefill.tp, prefill.dp, prefill.ep) == (2, 2, 4)
    assert (decode.tp, decode.dp, decode.ep) == (1, 8, 8)
    dense = Layout(tp=1, dp=2, prefill=1, decode=1, decode_dp=4).pools(2048, 64)
    assert [(pool.dp, pool.ep) for pool in dense] == [(2, 1), (4, 1)]  # replicas, no EP


# ---- expert and data parallelism ---------------------------------------------------------


def test_ep_dp_flags_per_engine(tmp_path):
    out = export(tmp_path, ["tp=2", "dp=2", "ep=4"])
    # vLLM docs/serving/expert_parallel_deployment.md: TP within each DP rank, EP = TP x DP
    vllm = parse((out / "vllm-cuda.sh").read_text())[1]
    assert (vllm["--tensor-parallel-size"], vllm["--data-parallel-size"]) == ("2", "2")
    assert vllm["--enable-expert-parallel"] is True
    # SGLang server_arguments.md: --tp-size is every GPU; --dp-size with --enable-dp-attention
    sglang = parse((out / "sglang.sh").read_text())[1]
    assert (sglang["--tp-size"], sglang["--dp-size"], sglang["--ep-size"]) == ("4", "2", "4")
    assert sglang["--enable-dp-attention"] is True
    # trtllm-serve --tp_size (every GPU) --ep_size; the LLM API's enable_attention_dp
    trt = parse((out / "trtllm.sh").read_text())[1]
    assert (trt["--tp_size"], trt["--ep_size"]) == ("4", "4")
    assert yaml.safe_load((out / "trtllm-options.yaml").read_text())["enable_attention_dp"]
    # FastDeploy docs/features/data_parallel_service.md
    fd = parse((out / "fastdeploy-gpu.sh").read_text())[1]
    assert (fd["--tensor-parallel-size"], fd["--data-parallel-size"]) == ("2", "2")
    assert fd["--enable-expert-parallel"] is True
    assert "each on its own 4 card(s)" in (out / "vllm-cuda.sh").read_text()


@pytest.mark.parametrize(
    "dispatch, backend",
    [
        ("allgather", "allgather_reducescatter"),
        ("per_rank", "deepep_high_throughput"),
        ("per_expert", "deepep_low_latency"),
    ],
)
def test_the_planned_moe_dispatch_is_vllms_all2all_backend(tmp_path, dispatch, backend):
    # vLLM docs/serving/expert_parallel_deployment.md, "Backend Selection Guide"
    out = export(tmp_path, ["tp=1", "dp=2", "ep=2", f"ep_dispatch={dispatch}"])
    assert parse((out / "vllm-cuda.sh").read_text())[1]["--all2all-backend"] == backend
    # SGLang picks its own kernels: the assumption is said, not dropped
    assert f"ep_dispatch={dispatch}: not set" in (out / "sglang.sh").read_text()


def test_no_parallel_flag_at_ep_1_dp_1(tmp_path):
    out = export(tmp_path, ["tp=2"])
    for script in ("vllm-cuda.sh", "sglang.sh", "trtllm.sh", "fastdeploy-gpu.sh"):
        flags = parse((out / script).read_text())[1]
        assert not {"--data-parallel-size", "--enable-expert-parallel", "--dp-size",
                    "--enable-dp-attention", "--ep-size", "--ep_size",
                    "--all2all-backend"} & set(flags)  # fmt: skip
    assert "enable_attention_dp" not in yaml.safe_load((out / "trtllm-options.yaml").read_text())


def test_ep_dp_on_gaudi(tmp_path):
    out = export(tmp_path, [ERNIE, "tp=1", "dp=4", "ep=4"], device="gaudi3")
    # vllm-gaudi: supported_features.md (Data Parallel), examples/nixl (--enable-expert-parallel)
    vllm = parse((out / "vllm-gaudi.sh").read_text())[1]
    assert (vllm["--data-parallel-size"], vllm["--enable-expert-parallel"]) == ("4", True)
    fd_text = (out / "fastdeploy-hpu.sh").read_text()
    fd = parse(fd_text)[1]
    assert (fd["--data-parallel-size"], fd["--enable-expert-parallel"]) == ("4", True)
    assert "Intel Gaudi guide shows no expert- or data-parallel run" in fd_text


# ---- disaggregated prefill and decode ----------------------------------------------------

DISAGG = ["tp=2", "disagg.prefill=1", "disagg.decode=2", "disagg.decode_tp=4",
          "disagg.prefill_max_tokens=8192", "disagg.decode_max_num_seqs=128"]  # fmt: skip


def command(script: str) -> list[str]:
    """The router's command, as its words."""
    return shlex.split(script.split("\nexec ", 1)[1])


def test_disaggregated_pools_and_router_per_engine(tmp_path):
    out = export(tmp_path, DISAGG)
    names = sorted(p.name for p in out.iterdir())
    for stem in ("vllm-cuda", "sglang", "trtllm", "fastdeploy-gpu"):
        assert {f"{stem}-prefill.sh", f"{stem}-decode.sh", f"{stem}-router.sh"} <= set(names)
        assert f"{stem}.sh" not in names
    pools = {}
    for stem in ("vllm-cuda", "sglang", "trtllm", "fastdeploy-gpu"):
        for role in ("prefill", "decode"):
            pools[stem, role] = parse((out / f"{stem}-{role}.sh").read_text())[1]
    # each pool: its own tp and limit (prefill: 2 cards, 8192 tokens; decode: 4, 128 rows)
    assert pools["vllm-cuda", "prefill"]["--tensor-parallel-size"] == "2"
    assert pools["vllm-cuda", "prefill"]["--max-num-batched-tokens"] == "8192"
    assert pools["vllm-cuda", "decode"]["--tensor-parallel-size"] == "4"
    assert pools["vllm-cuda", "decode"]["--max-num-seqs"] == "128"
    # vLLM docs/features/nixl_connector_usage.md: NixlConnector, kv_both on both sides
    for role in ("prefill", "decode"):
        kv = json.loads(pools["vllm-cuda", role]["--kv-transfer-config"])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert pools["vllm-cuda", role]["--port"] == "$PORT"
        # SGLang pd_disaggregation.md: --disaggregation-mode prefill|decode
        assert pools["sglang", role]["--disaggregation-mode"] == role
        # FastDeploy disaggregated.md: --splitwise-role, the splitwise scheduler over Redis
        fd = pools["fastdeploy-gpu", role]
        assert (fd["--splitwise-role"], fd["--scheduler-name"]) == (role, "splitwise")
        assert fd["--cache-transfer-protocol"] == "rdma,ipc"
    assert pools["sglang", "decode"]["--tp-size"] == "4"
    assert pools["trtllm", "decode"]["--tp_size"] == "4"
    # two replicas: 2 prefill servers on 8100-8101, 4 decode servers on 8200-8203
    vllm_router = command((out / "vllm-cuda-router.sh").read_text())
    assert vllm_router == [
        "python", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "--port", "8000",
        "--prefiller-hosts", "localhost", "localhost", "--prefiller-ports", "8100", "8101",
        "--decoder-hosts", *["localhost"] * 4, "--decoder-ports", "8200", "8201", "8202", "8203",
    ]  # fmt: skip
    sglang_router = command((out / "sglang-router.sh").read_text())
    assert sglang_router[:4] == [
        "python",
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
    ]
    assert sglang_router.count("--prefill") == 2 and sglang_router.count("--decode") == 4
    assert "http://localhost:8203" in sglang_router
    # its default is cache_aware (sgl-project/sglang router docs): in turn, as simulated
    assert sglang_router[sglang_router.index("--policy") + 1] == "round_robin"
    assert command((out / "fastdeploy-gpu-router.sh").read_text()) == [
        "redis-server", "--port", "6379"]  # fmt: skip


def test_a_hashing_router_is_deployed_where_the_engines_router_has_it(tmp_path):
    out = export(tmp_path, [*DISAGG, "disagg.router=consistent_hash"])
    # vllm-project/router docs/model-routing/pd-disaggregation.md, NIXL connector mode
    vllm_router = command((out / "vllm-cuda-router.sh").read_text())
    assert vllm_router[:2] == ["vllm-router", "--vllm-pd-disaggregation"]
    assert vllm_router[vllm_router.index("--policy") + 1] == "consistent_hash"
    assert vllm_router.count("--prefill") == 2 and vllm_router.count("--decode") == 4
    # SGLang's script keeps its router in turn and says the run's policy is not there
    sglang = (out / "sglang-router.sh").read_text()
    assert "disagg.router=consistent_hash; this router has no such policy" in sglang
    vllm_text = (out / "vllm-cuda-router.sh").read_text()
    assert "# vllm-router: vllm-project/router" in vllm_text and "the proxy ships" not in vllm_text
    assert "#" not in vllm_text.split("exec ", 1)[1]


@pytest.mark.parametrize("policy", ["power_of_two", "cache_aware"])
def test_a_policy_both_routers_have_is_their_own(tmp_path, policy):
    out = export(tmp_path, [*DISAGG, f"disagg.router={policy}"])
    for stem, first in (("vllm-cuda", "vllm-router"), ("sglang", "python")):
        words = command((out / f"{stem}-router.sh").read_text())
        assert words[0] == first and words[words.index("--policy") + 1] == policy
    # SGLang's own router keeps its note (the transfer backend); no policy comment
    sglang = (out / "sglang-router.sh").read_text()
    assert "--disaggregation-transfer-backend" in sglang and "no such policy" not in sglang


def test_an_unknown_router_policy_never_reaches_a_script(tmp_path):
    config = config_of(["hardware=h100", *DISAGG])
    config["disagg"]["router"] = "round_robin\nrm -rf ~"
    with pytest.raises(ValueError, match="disagg.router='round_robin\\\\nrm -rf ~': give one"):
        write_deploy(deployment(config, 1000, "org/m", origin="a test"), [], tmp_path / "d")


def test_disaggregated_pools_with_expert_parallelism_per_engine(tmp_path):
    out = export(tmp_path, ["tp=1", "dp=2", "ep=2", "disagg.prefill=1", "disagg.decode=1",
                            "disagg.decode_dp=4"])  # fmt: skip
    # vLLM docs/serving/expert_parallel_deployment.md, per pool: its dp, EP over tp x dp
    for role, dp in (("prefill", "2"), ("decode", "4")):
        vllm = parse((out / f"vllm-cuda-{role}.sh").read_text())[1]
        assert (vllm["--tensor-parallel-size"], vllm["--data-parallel-size"]) == ("1", dp)
        assert vllm["--enable-expert-parallel"] is True
        sglang = parse((out / f"sglang-{role}.sh").read_text())[1]
        assert (sglang["--tp-size"], sglang["--dp-size"], sglang["--ep-size"]) == (dp, dp, dp)
    assert "each on its own 4 card(s)" in (out / "vllm-cuda-decode.sh").read_text()


def test_trtllm_disaggregated_config(tmp_path):
    out = export(tmp_path, DISAGG)
    # docs/source/features/disagg-serving.md: `trtllm-serve disaggregated -c CONFIG`
    assert command((out / "trtllm-router.sh").read_text()) == [
        "trtllm-serve", "disaggregated", "-c", "$(dirname $0)/trtllm-disagg.yaml"]  # fmt: skip
    config = yaml.safe_load((out / "trtllm-disagg.yaml").read_text())
    assert config == {
        "hostname": "localhost", "port": 8000, "backend": "pytorch",
        "context_servers": {"num_instances": 2, "urls": ["localhost:8100", "localhost:8101"]},
        "generation_servers": {"num_instances": 4, "urls": [
            "localhost:8200", "localhost:8201", "localhost:8202", "localhost:8203"]},
    }  # fmt: skip
    prefill = yaml.safe_load((out / "trtllm-prefill-options.yaml").read_text())
    decode = yaml.safe_load((out / "trtllm-decode-options.yaml").read_text())
    assert prefill["cache_transceiver_config"] == {"backend": "DEFAULT"}
    assert prefill["disable_overlap_scheduler"] is True
    assert decode["cache_transceiver_config"] == {"backend": "DEFAULT"}
    assert parse((out / "trtllm-decode.sh").read_text())[1]["--extra_llm_api_options"] == (
        "$(dirname $0)/trtllm-decode-options.yaml"
    )


def test_disaggregated_on_gaudi(tmp_path):
    out = export(tmp_path, [ERNIE, *DISAGG], device="gaudi3")
    # vllm-gaudi examples/nixl: kv_producer on prefill, kv_consumer on decode
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        flags = parse((out / f"vllm-gaudi-{role}.sh").read_text())[1]
        assert json.loads(flags["--kv-transfer-config"]) == {
            "kv_connector": "NixlConnector", "kv_role": kv_role,
            "kv_buffer_device": "cpu"}  # fmt: skip
    router = command((out / "vllm-gaudi-router.sh").read_text())
    assert router[:2] == ["python", "examples/nixl/toy_proxy_server.py"]
    fd = (out / "fastdeploy-hpu.sh").read_text()
    assert "disagg: not set" in fd and "--splitwise-role" not in fd
    # the plan's 2 replicas of 1 x 2 + 2 x 4 = 10 cards, as copies of tp 2: 2 x 5 = 10
    assert "Start 10 copies of this server, each on its own 2 card(s)" in fd


# ---- speculative decoding ----------------------------------------------------------------


def test_mtp_per_engine(tmp_path):
    out = export(tmp_path, ["tp=2", "speculative.method=mtp", "speculative.tokens=2"])
    # vLLM docs/features/speculative_decoding/mtp.md
    vllm = parse((out / "vllm-cuda.sh").read_text())[1]
    assert json.loads(vllm["--speculative-config"]) == {"method": "mtp",
                                                        "num_speculative_tokens": 2}  # fmt: skip
    # SGLang speculative_decoding.md: MTP through EAGLE, steps k, topk 1, k + 1 draft tokens
    sglang = parse((out / "sglang.sh").read_text())[1]
    assert [sglang[f] for f in ("--speculative-algorithm", "--speculative-num-steps",
            "--speculative-eagle-topk", "--speculative-num-draft-tokens")] == [
        "EAGLE", "2", "1", "3"]  # fmt: skip
    # TensorRT-LLM speculative-decoding.md: speculative_config decoding_type MTP
    options = yaml.safe_load((out / "trtllm-options.yaml").read_text())
    assert options["speculative_config"] == {"decoding_type": "MTP",
                                             "num_nextn_predict_layers": 2}  # fmt: skip
    # FastDeploy speculative_decoding.md: method mtp, "model" the MTP weights; 1 token at most
    text = (out / "fastdeploy-gpu.sh").read_text()
    config = json.loads(parse(text)[1]["--speculative-config"])
    assert config == {"method": "mtp", "num_speculative_tokens": 2, "model": "$MTP_MODEL"}
    assert ': "${MTP_MODEL:?' in text and "allows at most 1 for mtp" in text


def test_draft_and_ngram_per_engine(tmp_path):
    out = export(tmp_path, ["speculative.method=draft", "speculative.tokens=3",
                            "speculative.draft_model=spec/llama32_1b"])  # fmt: skip
    text = (out / "vllm-cuda.sh").read_text()
    assert json.loads(parse(text)[1]["--speculative-config"]) == {
        "method": "draft_model", "num_speculative_tokens": 3, "model": "$DRAFT_MODEL"}  # fmt: skip
    assert ': "${DRAFT_MODEL:?' in text
    sglang = parse((out / "sglang.sh").read_text())[1]
    assert sglang["--speculative-algorithm"] == "STANDALONE"
    assert sglang["--speculative-draft-model-path"] == "$DRAFT_MODEL"
    options = yaml.safe_load((out / "trtllm-options.yaml").read_text())
    assert options["speculative_config"] == {
        "decoding_type": "DraftTarget", "max_draft_len": 3,
        "speculative_model_dir": "DRAFT_MODEL"}  # fmt: skip
    fd = (out / "fastdeploy-gpu.sh").read_text()  # no draft-model speculation in FastDeploy
    assert "--speculative-config" not in fd and "speculative.method=draft: not set" in fd

    out = export(tmp_path / "ngram", ["speculative.method=ngram", "speculative.tokens=4"])
    assert json.loads(parse((out / "vllm-cuda.sh").read_text())[1]["--speculative-config"]) == {
        "method": "ngram", "num_speculative_tokens": 4}  # fmt: skip
    assert parse((out / "sglang.sh").read_text())[1]["--speculative-algorithm"] == "NGRAM"
    options = yaml.safe_load((out / "trtllm-options.yaml").read_text())
    assert options["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4}


def test_eagle_tree_and_chain_per_engine(tmp_path):
    tree = ["speculative.method=eagle", "speculative.steps=5", "speculative.topk=8",
            "speculative.draft_tokens=32"]  # fmt: skip
    out = export(tmp_path, tree)
    # SGLang speculative_decoding.md: EAGLE3 with its three numbers and the head's weights
    sglang = parse((out / "sglang.sh").read_text())[1]
    assert [sglang[f] for f in ("--speculative-algorithm", "--speculative-num-steps",
            "--speculative-eagle-topk", "--speculative-num-draft-tokens",
            "--speculative-draft-model-path")] == [
        "EAGLE3", "5", "8", "32", "$DRAFT_MODEL"]  # fmt: skip
    # vLLM drafts a chain: method eagle3, as many tokens as the tree's passes, and says so
    text = (out / "vllm-cuda.sh").read_text()
    assert json.loads(parse(text)[1]["--speculative-config"]) == {
        "method": "eagle3", "num_speculative_tokens": 5, "model": "$DRAFT_MODEL"}  # fmt: skip
    assert "topk=8, draft_tokens=32: not set" in text
    fd = (out / "fastdeploy-gpu.sh").read_text()
    assert "--speculative-config" not in fd and "speculative.method=eagle: not set" in fd

    out = export(tmp_path / "chain", ["speculative.method=eagle", "speculative.tokens=3"])
    sglang = parse((out / "sglang.sh").read_text())[1]
    assert [sglang[f] for f in ("--speculative-num-steps", "--speculative-eagle-topk",
            "--speculative-num-draft-tokens")] == ["3", "1", "4"]  # fmt: skip
    options = yaml.safe_load((out / "trtllm-options.yaml").read_text())
    assert options["speculative_config"] == {
        "decoding_type": "Eagle",
        "max_draft_len": 3,
        "speculative_model_dir": "DRAFT_MODEL",
    }


def test_sglang_ngram_has_no_dp_attention(tmp_path):
    out = export(tmp_path, ["dp=2", "ep=2", "speculative.method=ngram"])
    text = (out / "sglang.sh").read_text()
    assert "--speculative-algorithm" not in text and "no DP attention" in text


def test_speculative_on_gaudi(tmp_path):
    out = export(tmp_path, [ERNIE, "speculative.method=mtp", "speculative.tokens=1"], "gaudi3")
    text = (out / "vllm-gaudi.sh").read_text()
    assert json.loads(parse(text)[1]["--speculative-config"]) == {
        "method": "mtp", "num_speculative_tokens": 1}  # fmt: skip
    assert "functional release" in text
    fd = (out / "fastdeploy-hpu.sh").read_text()
    assert "speculative: not set" in fd and "--speculative-config" not in fd
