"""How each GPU serving engine names the settings a plan chooses: one table per engine, each
name with the documentation page it was read from. pipeline/deploy/gpu.py renders scripts
from these tables; a setting an engine cannot express is a comment in its script.

Settings (pipeline.deploy.settings.Deployment): tp, max_num_seqs, max_tokens (the step's token
budget), max_model_len, block_size, chunked_prefill, prefix_caching, quantization (weights),
kv_cache_dtype, memory_fraction (of a card's memory the engine may take).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Kind(enum.Enum):
    VALUE = "value"  # `--flag VALUE`
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


VLLM_ARGS = "vllm-project/vllm docs/configuration/engine_args.md (vllm/engine/arg_utils.py)"
VLLM = Engine(
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
    },
    notes={
        "quantization": "vLLM quantizes on load to FP8 only; INT8/INT4 weights need a "
        "pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors) given as --model",
    },
)

SGLANG_ARGS = "sgl-project/sglang docs/advanced_features/server_arguments.md"
SGLANG = Engine(
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
    },
    notes={
        "quantization": "SGLang's --quantization has no weight-only INT8/INT4 on load "
        "(w8a8_int8 quantizes activations too); give a pre-quantized checkpoint",
    },
)

TRTLLM_SERVE = "NVIDIA/TensorRT-LLM docs/source/commands/trtllm-serve (1.0: trtllm-serve --help)"
TRTLLM_API = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (LlmArgs, KvCacheConfig)"
TRTLLM = Engine(
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
    },
    options_flag="--extra_llm_api_options",
    options_file="trtllm-options.yaml",
    notes={
        "quantization": "trtllm-serve loads weights as the checkpoint stores them: for FP8 "
        "give a ModelOpt FP8 checkpoint as MODEL; it has no INT8/INT4 weight-only flag",
    },
)

FASTDEPLOY_ARGS = "PaddlePaddle/FastDeploy docs/parameters.md"
FASTDEPLOY_QUANT = "PaddlePaddle/FastDeploy docs/quantization/online_quantization.md"
FASTDEPLOY = Engine(
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
    },
    notes={
        "kv_cache_dtype": "FastDeploy quantizes the KV cache only in offline MixQuant "
        "checkpoints (docs/quantization), with no FP8 cache setting",
    },
)

GPU_ENGINES = (VLLM, SGLANG, TRTLLM, FASTDEPLOY)
