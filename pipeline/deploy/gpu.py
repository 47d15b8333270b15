"""Launch scripts for a planned configuration on NVIDIA GPUs: vLLM, SGLang, TensorRT-LLM's
trtllm-serve (with its options YAML) and FastDeploy, each from its flag table
(pipeline/deploy/flags.py), with expert / data parallelism and speculative decoding; a
disaggregated configuration gets each engine's prefill and decode scripts and its router's
(pipeline/deploy/layouts.py). A setting an engine has no name for is a comment in its
script; no HPU variable is set.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.config.engine_profile import serves_architecture
from pipeline.deploy.consistency import NATIVE, simulated_note
from pipeline.deploy.flags import GPU_ENGINES, TRTLLM, Engine, Flag, Kind
from pipeline.deploy.layouts import (
    Extra,
    role_extra,
    router_script,
    shell_args,
    speculative,
    trtllm_disagg_config,
)
from pipeline.deploy.settings import pool_deployment, replicas_line
from pipeline.run_folder.run_files import output_folder, write_file

if TYPE_CHECKING:
    from pipeline.deploy.settings import Deployment


def settings(d: Deployment, engine: Engine | None = None) -> dict[str, Any]:
    """The settings a script expresses, by the names the flag tables use; tp counts every
    card where the engine's tp flag spans the dp attention replicas."""
    spans = engine is not None and engine.tp_spans_dp
    return {
        "tp": d.tp * d.layout.dp if spans else d.tp,
        "max_num_seqs": d.max_num_seqs,
        "max_tokens": d.max_tokens,
        "max_model_len": d.max_model_len,
        "block_size": d.block_size,
        "chunked_prefill": d.chunked_prefill,
        "prefix_caching": d.prefix_caching,
        "quantization": "none" if d.prequantized else str(d.quantization),
        "kv_cache_dtype": str(d.kv_cache_dtype),
        "memory_fraction": d.memory_fraction,
        "dp": d.layout.dp,
        "attention_dp": d.layout.dp > 1,
        "ep": d.layout.ep,
        "ep_dispatch": d.layout.ep_dispatch if d.layout.ep > 1 else "none",
    }


def _args(engine: Engine, key: str, value: Any, d: Deployment) -> list[str] | str:
    """The flag's arguments for `value`, or a comment's text when it has no counterpart."""
    flag = engine.flags[key]
    if flag.kind is Kind.SWITCH:
        return [flag.name] if value is True or (value is not False and value > 1) else []
    if flag.kind is Kind.VALUE:
        if flag.skip is not None and value == flag.skip:
            return []
        if key == "chunked_prefill":  # SGLang: the chunk size, or -1 for none
            return [flag.name, str(d.max_tokens if value else -1)]
        return [flag.name, str(value)]
    if flag.kind is Kind.ON_OFF:
        return [flag.name] if value else ([flag.off] if flag.off else [])
    if flag.kind is Kind.OFF_SWITCH:
        return [] if value else [flag.name]
    if value in ("none", "auto"):  # the model's own precision: the engine's default
        return []
    if value in flag.choices:
        return [flag.name, flag.choices[value]]
    return f"no {engine.name} counterpart ({flag.name} takes {', '.join(sorted(flag.choices))})"


def _yaml_value(flag: Flag, value: Any) -> Any:
    return flag.choices.get(value, value) if flag.choices else value


def render(
    engine: Engine, d: Deployment, extra: Extra | None = None, options_file: str = ""
) -> tuple[str, dict[str, Any] | None]:
    """The script, and the options file's content where the engine takes one; `extra`: a
    pool's role arguments and options (pipeline/deploy/layouts.py)."""
    comments: list[str] = []
    args: list[str] = []
    options: dict[str, Any] = {}
    for key, value in settings(d, engine).items():
        flag = engine.flags.get(key)
        if flag is None:
            if key in engine.notes and value not in ("none", "auto"):
                comments.append(f"{key}={value}: not set: {engine.notes[key]}.")
            continue
        if flag.kind is Kind.YAML:
            if value in ("none", "auto") or (flag.choices and value not in flag.choices):
                continue
            if flag.skip is not None and value == flag.skip:
                continue
            node = options
            *parents, leaf = flag.name.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = _yaml_value(flag, value)
            continue
        got = _args(engine, key, value, d)
        if isinstance(got, str):
            comments.append(f"{key}={value}: not set: {engine.notes.get(key, got)}.")
        else:
            args += got
    setup: list[str] = []
    for more in (speculative(engine.speculative, d, engine.name), extra or Extra()):
        args, setup, comments = args + more.args, setup + more.setup, comments + more.comments
        options.update(more.options)
    if engine.options_flag:
        name = options_file or engine.options_file
        args += [engine.options_flag, f'"$(dirname "$0")/{name}"']
    script = _script(engine, d, comments, args, setup)
    return script, (options if engine.options_flag else None)


def _docs(engine: Engine, d: Deployment) -> list[str]:
    """The pages the script's names were read from: its flags', and its layout's."""
    docs = {f.doc for f in engine.flags.values()} | {engine.doc}
    if engine.speculative and d.layout.speculative != "none":
        docs.add(engine.speculative.doc)
    if engine.disagg and d.role:
        docs.add(engine.disagg.doc)
    return sorted(docs)


def _script(
    engine: Engine,
    d: Deployment,
    comments: Sequence[str],
    args: Sequence[str],
    setup: Sequence[str] = (),
) -> str:
    docs = _docs(engine, d)
    lines = [
        "#!/usr/bin/env bash",
        f"# {engine.name}: {shlex.quote(d.model)}, {d.origin}.",
        replicas_line(d, "CUDA_VISIBLE_DEVICES"),
        "# Flag names as read from: " + "; ".join(docs) + ".",
        "set -euo pipefail",
        *setup,
        *simulated_note(d, engine.profile, engine.name),
    ]
    if d.scheduler not in ("ChunkedScheduler", "WholeScheduler"):
        lines.append(
            f"# scheduler {shlex.quote(d.scheduler)}: no counterpart (this server batches "
            "continuously); the plan's figures for it do not carry over."
        )
    lines += [f"# {c}" for c in comments]
    command = engine.command.replace("MODEL", shlex.quote(d.model))
    quoted = [a if a.startswith('"$(') else b for a, b in zip(args, shell_args(args), strict=True)]
    pairs, i = [], 0
    while i < len(quoted):  # one flag and its value a line
        value = i + 1 < len(quoted) and not quoted[i + 1].startswith("--")
        pairs.append(" ".join(quoted[i : i + 2]) if value else quoted[i])
        i += 2 if value else 1
    lines.append(" \\\n  ".join([f"exec {command}", *pairs]))
    return "\n".join(lines) + "\n"


def _write(out: Path, name: str, text: str) -> Path:
    return write_file(out / name, text, executable=name.endswith(".sh"))


def write_gpu_deploy(d: Deployment, out: Path) -> list[Path]:
    """The run's engine's script (engine=native: every GPU engine's, each saying it was
    not simulated; trtllm-serve's options file too) into `out`; for a disaggregated
    configuration the engine's prefill, decode and router scripts."""
    output_folder(out)
    written = []
    for engine in GPU_ENGINES:
        if d.engine not in (NATIVE, engine.profile):  # the run's engine's scripts only
            continue
        if not serves_architecture(engine.profile, True, d.architecture):
            continue  # (engine=native: an engine that does not serve the model gets none)
        if d.layout.disaggregated and engine.disagg is not None:
            written += _write_pools(engine, d, out)
            continue
        script, options = render(engine, d)
        written.append(_write(out, engine.script, script))
        if options is not None:
            written.append(_write(out, engine.options_file, yaml.safe_dump(options)))
    return written


def _write_pools(engine: Engine, d: Deployment, out: Path) -> list[Path]:
    """ENGINE-prefill.sh and ENGINE-decode.sh (each with its options file where the engine
    takes one) and ENGINE-router.sh (trtllm-serve's with its configuration)."""
    assert engine.disagg is not None
    stem, written = engine.script.removesuffix(".sh"), []
    for pool in d.layout.pools(d.max_tokens, d.max_num_seqs):
        options_name = f"{stem}-{pool.role}-options.yaml"
        extra = role_extra(engine.disagg, pool.role)
        script, options = render(engine, pool_deployment(d, pool), extra, options_name)
        written.append(_write(out, f"{stem}-{pool.role}.sh", script))
        if options is not None:
            written.append(_write(out, options_name, yaml.safe_dump(options)))
    config = ""
    if engine is TRTLLM:
        config = f"{stem}-disagg.yaml"
        written.append(_write(out, config, yaml.safe_dump(trtllm_disagg_config(d))))
        config = f'"$(dirname "$0")/{config}"'
    router = router_script(engine.disagg, d, engine.name, config)
    written.append(_write(out, f"{stem}-router.sh", router))
    return written
