"""The Intel Gaudi servers' launch scripts: FastDeploy's OpenAI server on its HPU runner and
vLLM with the vllm-gaudi plugin, with the warmup grid each engine builds from its own
environment (stages/forward/engine_grids.py)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.config.engine_profile import serves_architecture
from pipeline.deploy.consistency import (
    NATIVE,
    model_len_lines,
    serving_compiles_lines,
    simulated_note,
    warmup_line,
)
from pipeline.deploy.flags import (
    FASTDEPLOY_HPU_NOTES,
    FASTDEPLOY_HPU_PARALLEL,
    VLLM_GAUDI_DISAGG,
    VLLM_GAUDI_PARALLEL,
    VLLM_GAUDI_SPECULATIVE,
)
from pipeline.deploy.layouts import (
    Extra,
    pairs,
    parallel_lines,
    role_extra,
    router_script,
    speculative,
)
from pipeline.deploy.settings import pool_deployment, replicas_line
from stages.forward.buckets import Bucketing
from stages.simulator.precision import KvCacheDtype, Quantization

if TYPE_CHECKING:
    from pipeline.deploy.settings import Deployment

VLLM_BUCKETS = "vllm-buckets.txt"
FASTDEPLOY, VLLM = "fastdeploy-hpu.sh", "vllm-gaudi.sh"
FASTDEPLOY_ENGINE, VLLM_ENGINE = "fastdeploy", "vllm"  # their engine= names (conf/engine/)

# quantization and kv_cache_dtype as each server names them. FastDeploy's Intel Gaudi
# guide takes weight-only wint8/wint4 and no FP8 or KV-cache dtype. vllm-gaudi runs FP8
# through Intel Neural Compressor (vLLM's "FP8 INC" page): `--quantization inc` with the
# model's calibrated QUANT_CONFIG, and `--kv-cache-dtype fp8_inc`; it has no wint8/wint4.
FASTDEPLOY_QUANTIZATION = {"wint8": "wint8", "wint4": "wint4"}
VLLM_QUANTIZATION = {"fp8": "inc"}
VLLM_KV_CACHE_DTYPE = {"fp8": "fp8_inc"}

# VLLM_BUCKETING_STRATEGY for the strategies that are vllm-gaudi's own
VLLM_STRATEGY = {Bucketing.vllm_lin: "lin", Bucketing.vllm_exp: "exp", Bucketing.vllm_pad: "pad"}
# our axes as vllm-gaudi's range variables name them
VLLM_RANGES = {
    "prefill_batch": ("PROMPT", "BS"),
    "prefill_seq": ("PROMPT", "QUERY"),
    "prefill_blocks": ("PROMPT", "CTX"),
    "decode_batch": ("DECODE", "BS"),
    "decode_blocks": ("DECODE", "BLOCK"),
}


def _lines(parts: list[str]) -> str:
    return " \\\n  ".join(parts)


def _header(d: Deployment, server: str, note: str) -> list[str]:
    lines = [
        "#!/usr/bin/env bash",
        f"# {server}: {shlex.quote(d.model)}, {d.origin}.",
        f"# {note}",
        "set -euo pipefail",
    ]
    if d.scheduler not in ("ChunkedScheduler", "WholeScheduler"):
        # Static batching (scheduler=static) waits for a whole batch to end before admitting
        # more; both servers batch continuously and have no setting for it.
        lines.append(
            f"# scheduler {shlex.quote(d.scheduler)}: no counterpart in this server (it batches "
            "continuously); the simulated figures for it do not carry over."
        )
    if d.chunked_prefill and not d.align_chunks:
        # FastDeploy's HPU scheduler aligns a non-final chunk to block_size, and vllm-gaudi
        # pads a query to its block-sized buckets: neither has a switch for it.
        lines.append(
            "# scheduler.align_chunks=false: this server always cuts non-final chunks at "
            "whole blocks; no setting turns that off, so the simulated figures (unaligned "
            "chunks) do not carry over."
        )
    return lines


def fastdeploy_grid_lines(d: Deployment) -> list[str]:
    """The environment FastDeploy's HPU runner builds its warmup grid from, with the grid
    it predicts (the run's own figure where it simulated FastDeploy), what it leaves to
    compile while serving, and a warning when the recipe cache cannot hold it."""
    steps, grid = d.fastdeploy, d.fastdeploy_grid
    simulated = d.engine == FASTDEPLOY_ENGINE
    lines = [
        f"# FastDeploy's own warmup grid from these: {grid.runs:,} forward passes (prefill "
        f"{len(grid.prefill):,}, decode {len(grid.decode):,}, mixed {len(grid.mixed):,}), "
        f"compiling {d.fastdeploy_recipes:,} recipe sets (a mixed pass shares its parts' "
        "attention recipes and compiles its other ops at its total tokens).",
    ]
    recipes = d.fastdeploy_recipes
    ran = d.predicted.warmup_graphs if d.predicted is not None and simulated else recipes
    lines.append(warmup_line(ran, "recipe sets", d))
    if d.fastdeploy_parts != recipes:
        lines.append(
            f"# (A run of engine={d.engine} counts {d.fastdeploy_parts:,} graphs for this grid: "
            "it compiles a step's prefill and decode parts apart; FastDeploy also compiles a "
            "mixed pass's token-wise ops at its total tokens, as engine=fastdeploy counts them.)"
        )
    if d.bucketing is not Bucketing.fastdeploy:
        lines.append(
            f"# The run simulated metadata.bucketing={d.bucketing} (not this grid): "
            "simulate FastDeploy's with engine=fastdeploy."
        )
    if d.max_prefill_rows != steps.max_prefill_num:
        # FastDeploy schedules at most MAX_PREFILL_NUM prompts a step (its config's
        # max_prefill_batch), besides warming that many
        lines.append(
            f"# The run prefilled up to {d.max_prefill_rows or d.max_num_seqs} prompts a step "
            f"(scheduler.max_prefill_rows={d.max_prefill_rows}); FastDeploy schedules at most "
            f"MAX_PREFILL_NUM={steps.max_prefill_num}: simulate it with "
            + (
                f"scheduler.max_prefill_rows={steps.max_prefill_num}."
                if simulated
                else "engine=fastdeploy."
            )  # fmt: skip
        )
    lines += model_len_lines(d, simulated)
    if steps.warmup_model_len >= d.max_model_len:
        lines += serving_compiles_lines(d, simulated)
    lines += [f"export {name}={value}" for name, value in steps.env().items()]
    lines += [f"# {w}" for w in fastdeploy_warnings(d)]
    return lines


def fastdeploy_warnings(d: Deployment) -> list[str]:
    """A grid the recipe cache cannot hold: compiled recipes evicted and compiled again
    (each recipe set is several op recipes, so more sets than the cache holds is sure to)."""
    cache, recipes = d.fastdeploy.recipe_cache_num, d.fastdeploy_recipes
    if cache and recipes > cache:
        return [
            f"WARNING: FastDeploy's warmup grid holds {recipes:,} recipe sets, more than "
            f"FLAGS_intel_hpu_recipe_cache_num={cache:,}: recipes will be evicted and "
            "compiled again while serving; raise it or coarsen BLOCK_STEP_DECODE / "
            "BATCH_STEP_DECODE (metadata.fastdeploy.*)"
        ]
    return []


def fastdeploy_script(d: Deployment) -> str:
    """FastDeploy's OpenAI server on Intel HPU with the planned limits and warmup grid."""
    lines = _header(
        d, "FastDeploy on Intel Gaudi", "--model: the Paddle checkpoint (folder or id)."
    )
    lines += simulated_note(d, FASTDEPLOY_ENGINE, "FastDeploy")
    lines += [
        "export FD_ATTENTION_BACKEND=HPU_ATTN",
        f"export HPU_WARMUP_BUCKET={1 if d.warmup else 0}",
        "export PADDLE_DISTRI_BACKEND=xccl",
        "export PADDLE_XCCL_BACKEND=intel_hpu",
        *fastdeploy_grid_lines(d),
    ]
    args = [
        "exec python -m fastdeploy.entrypoints.openai.api_server",
        f"--model {shlex.quote(d.model)}",
        f"--tensor-parallel-size {d.tp}",
        f"--max-model-len {d.max_model_len}",
        f"--max-num-seqs {d.max_num_seqs}",
        f"--block-size {d.block_size}",
        f"--max-num-batched-tokens {d.max_tokens}",
    ]
    if d.chunked_prefill:
        args.append("--enable-chunked-prefill")
    args.append("--enable-prefix-caching" if d.prefix_caching else "--no-enable-prefix-caching")
    if d.quantization in FASTDEPLOY_QUANTIZATION:
        args.append(f"--quantization {FASTDEPLOY_QUANTIZATION[d.quantization]}")
    elif d.quantization != Quantization.none:
        lines.append(f"# quantization={d.quantization}: no FastDeploy HPU counterpart; not set.")
    if d.kv_cache_dtype != KvCacheDtype.auto:
        lines.append(f"# kv_cache_dtype={d.kv_cache_dtype}: no FastDeploy HPU setting; not set.")
    args.append("--graph-optimization-config '{\"use_cudagraph\":false}'")
    parallel = parallel_lines(FASTDEPLOY_HPU_PARALLEL, d)
    if parallel:
        args += parallel
        lines.append(f"# ep={d.layout.ep} dp={d.layout.dp}: {FASTDEPLOY_HPU_NOTES['parallel']}.")
    for key, on in (("speculative", d.layout.speculative != "none"),
                    ("disagg", d.layout.disaggregated)):  # fmt: skip
        if on:
            lines.append(f"# {key}: not set: {FASTDEPLOY_HPU_NOTES[key]}.")
    return "\n".join([*lines, _lines(args)]) + "\n"


def vllm_buckets_file(d: Deployment) -> str:
    """VLLM_BUCKETING_FROM_FILE's format, in vllm-gaudi's own axes: one product of lists
    per line. Prompt buckets (batch, query tokens, context blocks): vllm-gaudi's third axis
    counts the context's blocks only (0 for a fresh prompt), ours the chunk's with them, so
    each query size gets the context blocks our sizes leave beside it, 0 always among them;
    it drops a bucket whose batch x query exceeds --max-num-batched-tokens, so no such
    batch is listed. Decode buckets (batch, 1, blocks of all rows)."""
    b, bs, budget = d.buckets, d.block_size, d.max_tokens
    lines = []
    for query in b["prefill_seq"]:
        batches = [n for n in b["prefill_batch"] if n * query <= budget]
        if not batches:
            continue
        chunk = -(-query // bs)
        contexts = sorted({0, *(t - chunk for t in b["prefill_blocks"] if t > chunk)})
        lines.append(f"({batches}, {query}, {contexts})")
    decodes = [n for n in b["decode_batch"] if n <= budget]
    lines.append(f"({decodes}, 1, {b['decode_blocks']})")
    return "\n".join(lines) + "\n"


def _vllm_bucket_lines(d: Deployment) -> list[str]:
    """vllm-gaudi's own strategy with our ranges when the run used one (and no planned
    sizes), else the file."""
    strategy = VLLM_STRATEGY.get(d.bucketing)
    if strategy is None or d.planned:
        return [
            "# The bucket sets the simulation prepared, from the file beside this one, in",
            "# vllm-gaudi's axes: prompt (batch, query tokens, context blocks; 0 for a fresh",
            "# prompt), decode (batch, 1, blocks of all rows); none past the token budget.",
            'export VLLM_BUCKETING_FROM_FILE="$(dirname "$0")/' + VLLM_BUCKETS + '"',
        ]
    lines = [
        f"export VLLM_BUCKETING_STRATEGY={strategy}",
        "# VLLM_EXPONENTIAL_BUCKETING is deprecated (it overrides the strategy): left unset.",
    ]
    if d.bucketing is Bucketing.vllm_exp:
        return [*lines, "# exp overwrites user ranges: vllm-gaudi derives them from the limits."]
    for axis, (phase, dim) in VLLM_RANGES.items():
        low, step, high = d.ranges[axis]
        lines += [f"export VLLM_{phase}_{dim}_BUCKET_{k}={v}"
                  for k, v in (("MIN", low), ("STEP", step), ("MAX", high))]  # fmt: skip
    return lines


def vllm_script(d: Deployment, extra: Extra | None = None) -> str:
    """`vllm serve` on vllm-gaudi with the planned limits and the simulated bucket sets;
    `extra`: a disaggregated pool's role arguments."""
    lines = _header(
        d, "vLLM on Intel Gaudi (vllm-gaudi)", "The model: a Hugging Face id or folder."
    )
    simulated = d.engine == VLLM_ENGINE
    lines += simulated_note(d, VLLM_ENGINE, "vllm-gaudi")
    if d.predicted is not None and simulated:
        lines.append(warmup_line(d.predicted.warmup_graphs, "graphs", d))
    lines += serving_compiles_lines(d, simulated)
    more = [speculative(VLLM_GAUDI_SPECULATIVE, d, "vllm-gaudi"), extra or Extra()]
    lines += [line for m in more for line in m.setup]
    lines += [f"# {c}" for m in more for c in m.comments]
    lines += _vllm_bucket_lines(d)
    lines.append(f"export VLLM_SKIP_WARMUP={'false' if d.warmup else 'true'}")
    args = [
        f"exec vllm serve {shlex.quote(d.model)}",
        f"--tensor-parallel-size {d.tp}",
        f"--max-model-len {d.max_model_len}",
        f"--max-num-seqs {d.max_num_seqs}",
        f"--block-size {d.block_size}",
        f"--max-num-batched-tokens {d.max_tokens}",
        "--enable-chunked-prefill" if d.chunked_prefill else "--no-enable-chunked-prefill",
        "--enable-prefix-caching" if d.prefix_caching else "--no-enable-prefix-caching",
    ]
    if d.quantization in VLLM_QUANTIZATION:
        args.append(f"--quantization {VLLM_QUANTIZATION[d.quantization]}")
        lines += [
            "# FP8 through Intel Neural Compressor needs the model's measurements: QUANT_CONFIG",
            "# names the quantization JSON that calibration wrote (vLLM's FP8 INC page).",
            ': "${QUANT_CONFIG:?set QUANT_CONFIG to the INC quantization JSON of the model}"',
        ]
    elif d.quantization != Quantization.none:
        lines.append(f"# quantization={d.quantization}: no vllm-gaudi counterpart; not set.")
    if d.kv_cache_dtype in VLLM_KV_CACHE_DTYPE:
        args.append(f"--kv-cache-dtype {VLLM_KV_CACHE_DTYPE[d.kv_cache_dtype]}")
    elif d.kv_cache_dtype != KvCacheDtype.auto:
        lines.append(f"# kv_cache_dtype={d.kv_cache_dtype}: no vllm-gaudi counterpart; not set.")
    parallel = parallel_lines(VLLM_GAUDI_PARALLEL, d)
    if parallel or d.layout.speculative != "none":
        docs = {f.doc for f in VLLM_GAUDI_PARALLEL.values()} | {VLLM_GAUDI_SPECULATIVE.doc}
        lines.append(f"# ep, dp, speculative names as read from: {'; '.join(sorted(docs))}.")
    if d.role:
        lines.append(f"# {d.role} pool names as read from: {VLLM_GAUDI_DISAGG.doc}.")
    args += parallel + pairs([a for m in more for a in m.args])
    return "\n".join([*lines, _lines(args)]) + "\n"


def _with_replicas(d: Deployment, text: str) -> str:
    """After the shebang: how many copies to start."""
    head, _, rest = text.partition("\n")
    return f"{head}\n{replicas_line(d, 'HPU_VISIBLE_DEVICES')}\n{rest}"


def hpu_scripts(d: Deployment) -> dict[str, str]:
    """Each Gaudi file by name: the run's engine's (engine=native: both, each saying it
    was not simulated): FastDeploy's script, vllm-gaudi's (for a disaggregated
    configuration its prefill, decode and proxy scripts) and the bucket file."""
    files = {}
    fastdeploy = serves_architecture(FASTDEPLOY_ENGINE, False, d.architecture)
    if d.engine in (NATIVE, FASTDEPLOY_ENGINE) and fastdeploy:
        # FastDeploy on HPU runs aggregated whatever the plan (its script says so): its
        # copies take tp x dp cards each, as many as the plan's cards hold
        flat_layout = replace(d.layout, prefill=0, decode=0)
        copies = max(1, d.layout.cards // flat_layout.cards) * d.replicas
        flat = replace(d, layout=flat_layout, replicas=copies)
        files[FASTDEPLOY] = _with_replicas(flat, fastdeploy_script(d))
    if d.engine not in (NATIVE, VLLM_ENGINE):
        return files
    if not d.layout.disaggregated:
        files[VLLM] = _with_replicas(d, vllm_script(d))
    else:
        stem = VLLM.removesuffix(".sh")
        for pool in d.layout.pools(d.max_tokens, d.max_num_seqs):
            mine = pool_deployment(d, pool)
            text = vllm_script(mine, role_extra(VLLM_GAUDI_DISAGG, pool.role))
            files[f"{stem}-{pool.role}.sh"] = _with_replicas(mine, text)
        files[f"{stem}-router.sh"] = router_script(VLLM_GAUDI_DISAGG, d, "vllm-gaudi")
    files[VLLM_BUCKETS] = vllm_buckets_file(d)
    return files
