"""Launch scripts for a planned configuration on NVIDIA GPUs: vLLM, SGLang, TensorRT-LLM's
trtllm-serve (with its options YAML) and FastDeploy, each from its flag table
(pipeline/deploy/flags.py). A setting an engine has no name for is a comment in its script;
no HPU variable is set.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.deploy.flags import GPU_ENGINES, Engine, Flag, Kind
from pipeline.deploy.settings import replicas_line

if TYPE_CHECKING:
    from pipeline.deploy.settings import Deployment


def settings(d: Deployment) -> dict[str, Any]:
    """The settings a script expresses, by the names the flag tables use."""
    return {
        "tp": d.tp,
        "max_num_seqs": d.max_num_seqs,
        "max_tokens": d.max_tokens,
        "max_model_len": d.max_model_len,
        "block_size": d.block_size,
        "chunked_prefill": d.chunked_prefill,
        "prefix_caching": d.prefix_caching,
        "quantization": str(d.quantization),
        "kv_cache_dtype": str(d.kv_cache_dtype),
        "memory_fraction": d.memory_fraction,
    }


def _args(engine: Engine, key: str, value: Any, d: Deployment) -> list[str] | str:
    """The flag's arguments for `value`, or a comment's text when it has no counterpart."""
    flag = engine.flags[key]
    if flag.kind is Kind.VALUE:
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


def render(engine: Engine, d: Deployment) -> tuple[str, dict[str, Any] | None]:
    """The script, and the options file's content where the engine takes one."""
    comments: list[str] = []
    args: list[str] = []
    options: dict[str, Any] = {}
    for key, value in settings(d).items():
        flag = engine.flags.get(key)
        if flag is None:
            if key in engine.notes and value not in ("none", "auto"):
                comments.append(f"{key}={value}: not set: {engine.notes[key]}.")
            continue
        if flag.kind is Kind.YAML:
            if value in ("none", "auto") or (flag.choices and value not in flag.choices):
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
    if engine.options_flag:
        args += [engine.options_flag, f'"$(dirname "$0")/{engine.options_file}"']
    return _script(engine, d, comments, args), (options if engine.options_flag else None)


def _script(engine: Engine, d: Deployment, comments: Sequence[str], args: Sequence[str]) -> str:
    docs = sorted({f.doc for f in engine.flags.values()} | {engine.doc})
    lines = [
        "#!/usr/bin/env bash",
        f"# {engine.name}: {d.model}, {d.origin}.",
        replicas_line(d, "CUDA_VISIBLE_DEVICES"),
        "# Flag names as read from: " + "; ".join(docs) + ".",
        "set -euo pipefail",
    ]
    if d.scheduler not in ("ChunkedScheduler", "WholeScheduler"):
        lines.append(
            f"# scheduler {d.scheduler}: no counterpart (this server batches continuously); "
            "the plan's figures for it do not carry over."
        )
    lines += [f"# {c}" for c in comments]
    command = engine.command.replace("MODEL", shlex.quote(d.model))
    quoted = [a if a.startswith('"$(') else shlex.quote(a) for a in args]
    pairs, i = [], 0
    while i < len(quoted):  # one flag and its value a line
        value = i + 1 < len(quoted) and not quoted[i + 1].startswith("--")
        pairs.append(" ".join(quoted[i : i + 2]) if value else quoted[i])
        i += 2 if value else 1
    lines.append(" \\\n  ".join([f"exec {command}", *pairs]))
    return "\n".join(lines) + "\n"


def write_gpu_deploy(d: Deployment, out: Path) -> list[Path]:
    """Every GPU engine's script (and trtllm-serve's options file) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for engine in GPU_ENGINES:
        script, options = render(engine, d)
        path = out / engine.script
        path.write_text(script, encoding="utf-8")
        path.chmod(0o755)
        written.append(path)
        if options is not None:
            (out / engine.options_file).write_text(yaml.safe_dump(options, sort_keys=True))
            written.append(out / engine.options_file)
    return written
