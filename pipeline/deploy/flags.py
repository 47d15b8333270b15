"""How each GPU serving engine names the settings a plan chooses: one table per engine, each
name with the documentation page it was read from. pipeline/deploy/gpu.py renders scripts
from these tables; a setting an engine cannot express is a comment in its script.

Settings (pipeline.deploy.settings.Deployment): tp, max_num_seqs, max_tokens (the step's token
budget), max_model_len, block_size, chunked_prefill, prefix_caching, quantization (weights),
kv_cache_dtype, memory_fraction (of a card's memory the engine may take); beyond tensor
parallelism (pipeline/config/layout.py): ep and dp (experts over ep = tp x dp ranks, dp attention
replicas), with each engine's speculative-decoding names (Speculative) and its disaggregated
prefill/decode names (Disagg); pipeline/deploy/layouts.py renders those.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class Kind(enum.Enum):
    VALUE = "value"  # `--flag VALUE` (nothing when the value is the flag's `skip`)
    SWITCH = "switch"  # `--flag` when the value (a count: ep, dp) is above 1
    ON_OFF = "on_off"  # `--flag` when on, `off` (another flag, or "" for nothing) when off
    OFF_SWITCH = "off_switch"  # `--flag` when off, nothing when on
    CHOICE = "choice"  # `--flag choices[value]`; a value not in choices has no counterpart
    YAML = "yaml"  # a key of the engine's options file (`flag` is a dotted path)


@dataclass(frozen=True)
class Flag:
    name: str  # the flag, or the options file's dotted key
    doc: str  # where the name was read: repository and path, or the page
    kind: Kind = Kind.VALUE
    off: str = ""  # ON_OFF: the flag that turns it off ("" = off is the default)
    choices: dict[str, str] = field(default_factory=dict)  # CHOICE (and YAML choices)
    skip: object = None  # VALUE, YAML: a value that needs no flag (the engine's default)


@dataclass(frozen=True)
class Speculative:
    """How an engine names speculative decoding. style: `json` (one --speculative-config
    JSON: method, num_speculative_tokens, model), `sglang` (--speculative-algorithm and its
    step counts), `yaml` (the options file's speculative_config)."""

    doc: str
    style: str
    methods: dict[str, str]  # our speculative.method -> the engine's name
    notes: dict[str, str] = field(default_factory=dict)  # a method it lacks: why
    # a method that loads weights of its own: the variable the script takes their path from
    model_env: dict[str, str] = field(default_factory=lambda: {"draft": "DRAFT_MODEL"})
    max_tokens: dict[str, int] = field(default_factory=dict)  # method -> most it proposes
    # said in the script when speculation meets ep / dp or a disaggregated pool ("": fine)
    layout_note: str = ""
    caveat: str = ""  # said whenever the engine speculates


@dataclass(frozen=True)
class Disagg:
    """How an engine runs disaggregated prefill and decode: each pool's extra arguments
    (`{role}` and `{port}` filled in) and the router that joins them (`router` empty: the
    engine has none; `note` says how requests reach the pools)."""

    doc: str
    roles: dict[str, list[str]]  # prefill / decode -> arguments
    router: str = ""  # requests in turn (disagg.router=round_robin)
    note: str = ""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> options file
    # disagg.router -> its router's command and note ("": the one above); `router` and
    # these take {policy} where the router has a flag for it
    policies: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Engine:
    name: str
    script: str
    command: str  # before the flags; MODEL is replaced by the model
    doc: str  # the page the command itself is read from
    flags: dict[str, Flag]
    options_flag: str = ""  # the flag that names the YAML options file, if any
    options_file: str = ""
    notes: dict[str, str] = field(default_factory=dict)  # why a setting has no flag
    tp_spans_dp: bool = False  # its tp flag counts every card (tp x dp) under DP attention
    speculative: Speculative | None = None
    disagg: Disagg | None = None
    profile: str = ""  # its engine= option (conf/engine/), whose runs predict it


VLLM_ARGS = "vllm-project/vllm docs/configuration/engine_args.md (vllm/engine/arg_utils.py)"
VLLM_EP = "vllm-project/vllm docs/serving/expert_parallel_deployment.md"
VLLM_SPECULATIVE = Speculative(
    "vllm-project/vllm docs/features/speculative_decoding/ (mtp.md, draft_model.md, n_gram.md; "
    "methods: vllm/config/speculative.py)",
    "json",
    {"mtp": "mtp", "eagle": "eagle3", "draft": "draft_model", "ngram": "ngram"},
    model_env={"draft": "DRAFT_MODEL", "eagle": "DRAFT_MODEL"},
)
VLLM_DISAGG = "vllm-project/vllm docs/features/nixl_connector_usage.md"
# ep_dispatch (stages/simulator/expert_parallel.py) as vLLM's --all2all-backend names it
VLLM_DISPATCH = {
    "allgather": "allgather_reducescatter",
    "per_rank": "deepep_high_throughput",
    "per_expert": "deepep_low_latency",
}
# Where an engine has no one flag for it: the dispatch the plan assumed, said in a comment.
DISPATCH_NOTE = ("the plan assumed this MoE dispatch (stages/simulator/expert_parallel.py); "
                 "this engine picks its own kernels: check they move as much")  # fmt: skip
# disagg.router's policies by --policy: vllm-router (vllm-project/router docs/model-routing/
# pd-disaggregation.md) for vLLM, sglang_router for SGLang; both take these three
ROUTER_POLICIES = ("random", "power_of_two", "cache_aware")
VLLM_ROUTER = ("vllm-router --vllm-pd-disaggregation {prefill_urls} {decode_urls} "
               "--policy {policy} --host 0.0.0.0 --port 8000",
               "vllm-router: vllm-project/router")  # fmt: skip
SGLANG_ROUTER = ("python -m sglang_router.launch_router --pd-disaggregation {prefill_urls} "
                 "{decode_urls} --policy {policy} --host 0.0.0.0 --port 8000")  # fmt: skip
VLLM_NIXL_ROLES = {role: ["--port", "{port}", "--kv-transfer-config",
                          '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}']
                   for role in ("prefill", "decode")}  # fmt: skip
VLLM = Engine(
    profile="vllm",
    name="vLLM (CUDA)",
    script="vllm-cuda.sh",
    command="vllm serve MODEL",
    doc="vllm-project/vllm docs/cli/serve.md",
    flags={
        "tp": Flag("--tensor-parallel-size", VLLM_ARGS),
        "max_num_seqs": Flag("--max-num-seqs", VLLM_ARGS),
        "max_tokens": Flag("--max-num-batched-tokens", VLLM_ARGS),
        "max_model_len": Flag("--max-model-len", VLLM_ARGS),
        "block_size": Flag("--block-size", VLLM_ARGS),
        "chunked_prefill": Flag(
            "--enable-chunked-prefill", VLLM_ARGS, Kind.ON_OFF, off="--no-enable-chunked-prefill"
        ),
        "prefix_caching": Flag(
            "--enable-prefix-caching", VLLM_ARGS, Kind.ON_OFF, off="--no-enable-prefix-caching"
        ),
        # online FP8 (dynamic activation scales): docs/features/quantization/fp8.md
        "quantization": Flag("--quantization", VLLM_ARGS, Kind.CHOICE, choices={"fp8": "fp8"}),
        "kv_cache_dtype": Flag(
            "--kv-cache-dtype", VLLM_ARGS, Kind.CHOICE, choices={"fp8": "fp8", "auto": "auto"}
        ),
        "memory_fraction": Flag("--gpu-memory-utilization", VLLM_ARGS),
        "dp": Flag("--data-parallel-size", VLLM_EP, skip=1),
        "ep": Flag("--enable-expert-parallel", VLLM_EP, Kind.SWITCH),
        "ep_dispatch": Flag("--all2all-backend", VLLM_EP, Kind.CHOICE, choices=VLLM_DISPATCH),
    },
    speculative=VLLM_SPECULATIVE,
    disagg=Disagg(
        VLLM_DISAGG,
        roles=VLLM_NIXL_ROLES,
        router="python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port 8000 "
        "--prefiller-hosts {prefill_hosts} --prefiller-ports {prefill_ports} "
        "--decoder-hosts {decode_hosts} --decoder-ports {decode_ports}",
        note="the proxy ships in vLLM's source tree (run it from a checkout of vLLM); "
        "copies on one host need their own VLLM_NIXL_SIDE_CHANNEL_PORT",
        policies=dict.fromkeys(ROUTER_POLICIES + ("consistent_hash",), VLLM_ROUTER),
    ),  # fmt: skip
    notes={
        "quantization": "vLLM quantizes on load to FP8 only; INT8/INT4 weights need a "
        "pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors) given as --model",
    },
)

SGLANG_ARGS = "sgl-project/sglang docs/advanced_features/server_arguments.md"
SGLANG = Engine(
    profile="sglang",
    name="SGLang",
    script="sglang.sh",
    command="python -m sglang.launch_server --model-path MODEL",
    doc=SGLANG_ARGS,
    flags={
        "tp": Flag("--tp-size", SGLANG_ARGS),
        "max_num_seqs": Flag("--max-running-requests", SGLANG_ARGS),
        # the prefill batch's tokens; the chunk size below when chunked
        "max_tokens": Flag("--max-prefill-tokens", SGLANG_ARGS),
        "max_model_len": Flag("--context-length", SGLANG_ARGS),
        "block_size": Flag("--page-size", SGLANG_ARGS),
        # "-1 means disabling chunked prefill"; else the chunk size (our step budget)
        "chunked_prefill": Flag("--chunked-prefill-size", SGLANG_ARGS),
        "prefix_caching": Flag("--disable-radix-cache", SGLANG_ARGS, Kind.OFF_SWITCH),
        "quantization": Flag("--quantization", SGLANG_ARGS, Kind.CHOICE, choices={"fp8": "fp8"}),
        "kv_cache_dtype": Flag(
            "--kv-cache-dtype",
            SGLANG_ARGS,
            Kind.CHOICE,
            choices={"fp8": "fp8_e4m3", "auto": "auto"},
        ),
        "memory_fraction": Flag("--mem-fraction-static", SGLANG_ARGS),
        "dp": Flag("--dp-size", SGLANG_ARGS, skip=1),
        "attention_dp": Flag("--enable-dp-attention", SGLANG_ARGS, Kind.SWITCH),
        "ep": Flag("--ep-size", SGLANG_ARGS, skip=1),
    },
    tp_spans_dp=True,  # --tp-size is every card; --dp-size splits attention among them
    speculative=Speculative(
        "sgl-project/sglang docs/advanced_features/speculative_decoding.md",
        "sglang",
        {"mtp": "EAGLE", "eagle": "EAGLE3", "draft": "STANDALONE", "ngram": "NGRAM"},
        model_env={"draft": "DRAFT_MODEL", "eagle": "DRAFT_MODEL"},
        notes={"ngram_dp": "SGLang's NGRAM speculation has no DP attention"},
    ),
    disagg=Disagg(
        "sgl-project/sglang docs/advanced_features/pd_disaggregation.md",
        roles={
            role: ["--disaggregation-mode", role, "--port", "{port}"]
            for role in ("prefill", "decode")
        },
        router=SGLANG_ROUTER,
        policies=dict.fromkeys(ROUTER_POLICIES, (SGLANG_ROUTER, "")),
        note="the KV transfer backend is SGLang's default (mooncake, "
        "--disaggregation-transfer-backend); prefill copies on one host need their own "
        "--disaggregation-bootstrap-port",
    ),  # fmt: skip
    notes={
        "ep_dispatch": DISPATCH_NOTE,
        "quantization": "SGLang's --quantization has no weight-only INT8/INT4 on load "
        "(w8a8_int8 quantizes activations too); give a pre-quantized checkpoint",
    },
)

TRTLLM_SERVE = "NVIDIA/TensorRT-LLM docs/source/commands/trtllm-serve (1.0: trtllm-serve --help)"
TRTLLM_API = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (LlmArgs, KvCacheConfig)"
TRTLLM = Engine(
    profile="trtllm",
    name="TensorRT-LLM (trtllm-serve, PyTorch backend)",
    script="trtllm.sh",
    command="trtllm-serve MODEL",
    doc=TRTLLM_SERVE,
    flags={
        "tp": Flag("--tp_size", TRTLLM_SERVE),
        "max_num_seqs": Flag("--max_batch_size", TRTLLM_SERVE),
        "max_tokens": Flag("--max_num_tokens", TRTLLM_SERVE),
        "max_model_len": Flag("--max_seq_len", TRTLLM_SERVE),
        "block_size": Flag("kv_cache_config.tokens_per_block", TRTLLM_API, Kind.YAML),
        "chunked_prefill": Flag("enable_chunked_prefill", TRTLLM_API, Kind.YAML),
        "prefix_caching": Flag("kv_cache_config.enable_block_reuse", TRTLLM_API, Kind.YAML),
        "kv_cache_dtype": Flag(
            "kv_cache_config.dtype", TRTLLM_API, Kind.YAML, choices={"fp8": "fp8", "auto": "auto"}
        ),
        # of the memory free after the weights are loaded (not of the whole card)
        "memory_fraction": Flag("--kv_cache_free_gpu_memory_fraction", TRTLLM_SERVE),
        "ep": Flag("--ep_size", TRTLLM_SERVE, skip=1),  # the LLM API's moe_expert_parallel_size
        "attention_dp": Flag("enable_attention_dp", TRTLLM_API, Kind.YAML, skip=False),
    },
    tp_spans_dp=True,  # --tp_size is every card; enable_attention_dp splits attention
    speculative=Speculative(
        "NVIDIA/TensorRT-LLM docs/source/features/speculative-decoding.md (tensorrt_llm/llmapi/"
        "llm_args.py: MTPDecodingConfig, EagleDecodingConfig, DraftTargetDecodingConfig, "
        "NGramDecodingConfig)",
        "yaml",
        {"mtp": "MTP", "eagle": "Eagle", "draft": "DraftTarget", "ngram": "NGram"},
        model_env={"draft": "DRAFT_MODEL", "eagle": "DRAFT_MODEL"},
    ),
    disagg=Disagg(
        "NVIDIA/TensorRT-LLM docs/source/features/disagg-serving.md (examples/disaggregated/"
        "README.md)",
        roles={role: ["--host", "localhost", "--port", "{port}"] for role in ("prefill", "decode")},
        router="trtllm-serve disaggregated -c {config}",
        options={  # each server's KV transfer; a context server runs without overlap
            "prefill": {
                "cache_transceiver_config": {"backend": "DEFAULT"},
                "disable_overlap_scheduler": True,
            },
            "decode": {"cache_transceiver_config": {"backend": "DEFAULT"}},
        },
    ),  # fmt: skip
    options_flag="--extra_llm_api_options",
    options_file="trtllm-options.yaml",
    notes={
        "ep_dispatch": DISPATCH_NOTE,
        "quantization": "trtllm-serve loads weights as the checkpoint stores them: for FP8 "
        "give a ModelOpt FP8 checkpoint as MODEL; it has no INT8/INT4 weight-only flag",
    },
)

FASTDEPLOY_ARGS = "PaddlePaddle/FastDeploy docs/parameters.md"
FASTDEPLOY_QUANT = "PaddlePaddle/FastDeploy docs/quantization/online_quantization.md"
FASTDEPLOY_DP = "PaddlePaddle/FastDeploy docs/features/data_parallel_service.md"
FASTDEPLOY_SPECULATIVE = Speculative(
    "PaddlePaddle/FastDeploy docs/features/speculative_decoding.md",
    "json",
    {"mtp": "mtp", "ngram": "ngram"},
    notes={
        "draft": "FastDeploy lists draft-model speculation as coming, not supported",
        "eagle": "FastDeploy lists Eagle as coming, not supported",
    },
    model_env={"mtp": "MTP_MODEL"},  # "model": the MTP head's weights
    max_tokens={"mtp": 1, "ngram": 5},  # "max is 5, currently MTP supports only 1"
    layout_note="FastDeploy's page lists MTP with EP + DP + PD separation as coming",
)
FASTDEPLOY = Engine(
    profile="fastdeploy",
    name="FastDeploy (GPU)",
    script="fastdeploy-gpu.sh",
    command="python -m fastdeploy.entrypoints.openai.api_server --model MODEL",
    doc=FASTDEPLOY_ARGS,
    flags={
        "tp": Flag("--tensor-parallel-size", FASTDEPLOY_ARGS),
        "max_num_seqs": Flag("--max-num-seqs", FASTDEPLOY_ARGS),
        "max_tokens": Flag("--max-num-batched-tokens", FASTDEPLOY_ARGS),
        "max_model_len": Flag("--max-model-len", FASTDEPLOY_ARGS),
        "block_size": Flag("--block-size", FASTDEPLOY_ARGS),
        "chunked_prefill": Flag("--enable-chunked-prefill", FASTDEPLOY_ARGS, Kind.ON_OFF),
        "prefix_caching": Flag("--enable-prefix-caching", FASTDEPLOY_ARGS, Kind.ON_OFF),
        "quantization": Flag(
            "--quantization",
            FASTDEPLOY_QUANT,
            Kind.CHOICE,
            choices={"fp8": "block_wise_fp8", "wint8": "wint8", "wint4": "wint4"},
        ),  # fmt: skip
        "memory_fraction": Flag("--gpu-memory-utilization", FASTDEPLOY_ARGS),
        "dp": Flag("--data-parallel-size", FASTDEPLOY_DP, skip=1),
        "ep": Flag("--enable-expert-parallel", FASTDEPLOY_DP, Kind.SWITCH),
    },
    speculative=FASTDEPLOY_SPECULATIVE,
    disagg=Disagg(
        "PaddlePaddle/FastDeploy docs/features/disaggregated.md (multi-machine)",
        roles={
            role: [
                "--port",
                "{port}",
                "--splitwise-role",
                role,
                "--cache-transfer-protocol",
                "rdma,ipc",
                "--scheduler-name",
                "splitwise",
                "--scheduler-host",
                "127.0.0.1",
                "--scheduler-port",
                "6379",
                "--scheduler-ttl",
                "9000",
            ]
            for role in ("prefill", "decode")
        },
        router="redis-server --port 6379",
        note="FastDeploy has no proxy: its splitwise scheduler pairs prefill and decode "
        "instances through Redis (6.2 or newer) at --scheduler-host; each instance also "
        "needs its own --engine-worker-queue-port, --cache-queue-port, --pd-comm-port and "
        "--rdma-comm-ports (one per card) and KVCACHE_RDMA_NICS (scripts/get_rdma_nics.sh)",
    ),  # fmt: skip
    notes={
        "ep_dispatch": DISPATCH_NOTE,
        "kv_cache_dtype": "FastDeploy quantizes the KV cache only in offline MixQuant "
        "checkpoints (docs/quantization), with no FP8 cache setting",
    },
)

GPU_ENGINES = (VLLM, SGLANG, TRTLLM, FASTDEPLOY)


# Intel Gaudi (pipeline/deploy/hpu.py writes these servers' scripts by hand; their names for
# the layouts beyond tp are here).
VLLM_GAUDI_FEATURES = "vllm-project/vllm-gaudi docs/features/supported_features.md"
VLLM_GAUDI_NIXL = (
    "vllm-project/vllm-gaudi examples/nixl/README.md and disaggregated_prefill_server_launcher"
)
VLLM_GAUDI_PARALLEL = {  # "Data Parallel support"; the NIXL launcher's --enable-expert-parallel
    "dp": Flag("--data-parallel-size", VLLM_GAUDI_FEATURES, skip=1),
    "ep": Flag("--enable-expert-parallel", VLLM_GAUDI_NIXL, Kind.SWITCH),
}
VLLM_GAUDI_SPECULATIVE = Speculative(
    VLLM_GAUDI_FEATURES + " (vLLM's --speculative-config)",
    "json",
    {"mtp": "mtp", "draft": "draft_model", "ngram": "ngram"},
    caveat="vllm-gaudi lists speculative decoding as a functional release, not fully "
    "supported in the torch.compile execution mode",
)


def _nixl(role: str) -> str:
    config = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    return json.dumps(config)


VLLM_GAUDI_DISAGG = Disagg(
    VLLM_GAUDI_NIXL + "; docs/features/heterogeneous_pd.md (the proxy's arguments)",
    roles={"prefill": ["--port", "{port}", "--kv-transfer-config", _nixl("kv_producer")],
           "decode": ["--port", "{port}", "--kv-transfer-config", _nixl("kv_consumer")]},
    router="python examples/nixl/toy_proxy_server.py --port 8000 --prefiller-hosts "
    "{prefill_hosts} --prefiller-ports {prefill_ports} --decoder-hosts {decode_hosts} "
    "--decoder-ports {decode_ports}",
    note="the proxy ships in vllm-gaudi's source tree (examples/nixl); kv_buffer_device cpu "
    "is the launcher's default (hpu moves the KV device to device, with UCX_TLS gaudi_gdr)",
)  # fmt: skip
FASTDEPLOY_HPU_PARALLEL = {  # the GPU server's names: the Intel Gaudi guide shows no EP run
    "dp": Flag("--data-parallel-size", FASTDEPLOY_DP, skip=1),
    "ep": Flag("--enable-expert-parallel", FASTDEPLOY_DP, Kind.SWITCH),
}
FASTDEPLOY_HPU_NOTES = {
    "parallel": "FastDeploy's Intel Gaudi guide shows no expert- or data-parallel run: the "
    "flags are its GPU server's (docs/features/data_parallel_service.md), untried on HPU",
    "speculative": "FastDeploy's Intel Gaudi guide has no speculative decoding",
    "disagg": "FastDeploy's Intel Gaudi guide has no disaggregated deployment (its splitwise "
    "KV transfer is cudaMemcpyPeer or rdma_comm on GPUs); its copies are aggregated servers "
    "of the plan's tp and dp on the plan's cards, a capacity the plan did not simulate (plan "
    "disagg.prefill=0 disagg.decode=0 to size them)",
}
