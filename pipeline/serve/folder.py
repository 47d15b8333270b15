"""A serving session's run folder: the files a batch run leaves, written so that a server
that runs for days holds none of it in memory.

generations.jsonl gets each request's line as it ends (and is put in arrival order at
shutdown); metrics.json is computed at shutdown from the folder's own files, with the
batch run's definitions (`pipeline.job.metrics.summarise`).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
from omegaconf import DictConfig

from pipeline.job.engine import Engine
from pipeline.job.metrics import StepTotals, summarise
from pipeline.job.run import device_metrics, slo_of
from pipeline.job.slo import slo_metrics
from pipeline.run_folder import artefacts
from pipeline.run_folder.artefacts import GENERATIONS, STEPS
from pipeline.run_folder.reader import RunStatus
from pipeline.run_folder.records import GenerationRecord
from stages.scheduling.request import FinishReason, Request, Status


class GenerationAppender:
    """Appends each ended request's generations.jsonl line, flushed; keeps nothing."""

    def __init__(self, out_dir: Path, tokenizer) -> None:
        self.path = out_dir / GENERATIONS
        self.tokenizer = tokenizer
        with artefacts.writing(self.path):
            self._file = artefacts.open_no_link(self.path, "wb")

    def __call__(self, request: Request) -> None:
        line = artefacts.json_line(GenerationRecord.of(request, self.tokenizer).line())
        with artefacts.writing(self.path):
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with artefacts.writing(self.path):
            self._file.close()


def ended_request(line: dict[str, Any]) -> Request:
    """What summarise reads of a request, rebuilt from its generations.jsonl line: token
    times relative to an arrival at 0."""
    request = Request(
        id=line["id"],
        index=line["index"],
        prompt="",
        prompt_ids=range(line["prompt_tokens"]),
        max_new_tokens=line["max_new_tokens"],
        output_ids=line["output_ids"],
        status=Status.FINISHED,
        finish_reason=FinishReason(line["finish_reason"]) if line["finish_reason"] else None,
        error=line["error"],
        cached_tokens=line["cached_tokens"],
    )
    if line["ttft_s"] is not None:
        request.token_times = list(itertools.accumulate([line["ttft_s"], *line["itl_s"]]))
        request.finish_s = line["e2e_s"]
    return request


def step_counts(path: Path) -> tuple[StepTotals, int]:
    """The steps' real and padded tokens, and the requests preempted in all."""
    steps, preempted = StepTotals(), 0
    if path.is_file():
        with open(path, "rb") as f:
            for raw in f:
                try:
                    step = orjson.loads(raw)
                except orjson.JSONDecodeError:  # a line a kill cut short
                    continue
                steps.num_steps += 1
                steps.num_tokens += step["num_tokens"]
                steps.padded_tokens += step["padded_tokens"]
                preempted += len(step["preempted"])
    return steps, preempted


class ServerFiles:
    """The server's steps.jsonl and generations.jsonl, appended to as it serves."""

    def __init__(self, out_dir: Path, tokenizer) -> None:
        self.steps = artefacts.StepWriter(out_dir)
        try:
            self.generations = GenerationAppender(out_dir, tokenizer)
        except BaseException:
            self.steps.close()
            raise

    def close(self) -> None:
        self.steps.close()
        self.generations.close()


def folder_metrics(
    cfg: DictConfig,
    engine: Engine,
    out_dir: Path,
    duration_s: float,
    warmup_s: float,
    status: RunStatus,
    error: str | None,
) -> dict[str, Any]:
    """metrics.json's content from the folder's generations and steps; generations.jsonl is
    rewritten in arrival order on the way."""
    lines = sorted(artefacts.read_generations(out_dir / GENERATIONS), key=lambda g: g["index"])
    artefacts.replace_lines(out_dir / GENERATIONS, (artefacts.json_line(g) for g in lines))
    requests = [ended_request(g) for g in lines]
    del lines
    steps, preempted = step_counts(out_dir / STEPS)
    metrics = {
        "status": status,
        **summarise(requests, steps, duration_s),
        **slo_metrics(requests, duration_s, slo_of(cfg)),
        "bucket_misses": engine.metadata.bucket_misses,
        "warmup_s": warmup_s,
        **device_metrics(engine),
    }
    metrics["num_preemptions"] = preempted
    if error:
        metrics["error"] = error
    return metrics
