"""The run folder's files: resolved config, generations, steps and metrics."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.metrics import StepRecord, e2e_s, itl_s, ttft_s
from stages.request import Request


def write_resolved_config(cfg: DictConfig, out_dir: Path) -> None:
    (out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))


def output_text(request: Request, tokenizer) -> str:
    text = tokenizer.decode(request.output_ids)
    if request.finish_reason == "stop" and request.stop:
        # Like vLLM, the text ends before the stop string that ended it.
        cuts = [text.find(s) for s in request.stop if s in text]
        if cuts:
            text = text[: min(cuts)]
    return text


def generation_line(request: Request, tokenizer) -> dict[str, Any]:
    line = {
        "id": request.id,
        "prompt": request.prompt,
        "prompt_tokens": len(request.prompt_ids),
        "cached_tokens": request.cached_tokens,
        "output_ids": request.output_ids,
        "output_text": output_text(request, tokenizer),
        "finish_reason": request.finish_reason,
        "error": request.error,
        "ttft_s": ttft_s(request),
        "e2e_s": e2e_s(request),
        "itl_s": itl_s(request),
    }
    if request.logprobs:
        line["logprobs"] = [{str(k): v for k, v in entry.items()} for entry in request.logprobs]
    return line


def write_generations(requests: Sequence[Request], tokenizer, out_dir: Path) -> None:
    with open(out_dir / "generations.jsonl", "w", encoding="utf-8") as f:
        for request in sorted(requests, key=lambda r: r.index):
            f.write(json.dumps(generation_line(request, tokenizer), ensure_ascii=False) + "\n")


class StepWriter:
    """Appends one line per engine step as it happens, so a long run can be watched."""

    def __init__(self, out_dir: Path) -> None:
        self._file = open(out_dir / "steps.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def __call__(self, record: StepRecord) -> None:
        self._file.write(json.dumps(dataclasses.asdict(record)) + "\n")

    def close(self) -> None:
        self._file.close()


def write_metrics(metrics: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
