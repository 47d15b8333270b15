"""The runs a bucket plan is made from: their steps, and the limits their config fixes
(block size, budget, the largest value each axis can take)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from pipeline.run_folder.reader import read_mapping, read_metrics, read_step_lines
from stages.forward.bucket_axes import AXES, decode_blocks_limit, resolve_axes
from stages.forward.buckets import Axis, Bucketing, Buckets, StepRule
from stages.interfaces import Scheduler
from stages.scheduling.chunk_policy import Budget
from stages.scheduling.kv_cache import blocks_for


class SourceError(ValueError):
    """A folder that cannot be planned from; the message says why."""


@dataclass
class RunLimits:
    """What a run's config fixes about its buckets."""

    rule: StepRule  # block size, budget and budget rule, mixed warmup phase
    axes: dict[str, Axis]  # the config's min/step/max, any explicit sizes left out
    tops: dict[str, int]  # the largest value each axis can take under the config

    @property
    def block_size(self) -> int:
        return self.rule.block_size

    @property
    def max_tokens(self) -> int:
        return self.rule.max_tokens

    @property
    def mixed(self) -> bool:
        return self.rule.mixed

    def buckets(
        self, strategy: Bucketing | str, sizes: dict[str, list[int]] | None = None
    ) -> Buckets:
        """The config's set under a strategy, or the explicit `sizes` of every axis."""
        axes = self.axes
        if sizes:
            axes = {
                name: Axis(sizes[name][0], a.step, sizes[name][-1], tuple(sizes[name]))
                for name, a in axes.items()
            }
        return Buckets(strategy, axes)


def find_runs(source: Path) -> list[Path]:
    """The run folder itself, or every job folder under a sweep folder."""
    if (source / "steps.jsonl").is_file():
        return [source]
    runs = sorted(p.parent for p in source.glob("**/steps.jsonl"))
    if not runs:
        raise SourceError(f"{source}: no steps.jsonl here or below; give a run or sweep folder")
    return runs


def read_steps(run: Path) -> list[dict[str, Any]]:
    steps = read_step_lines(run / "steps.jsonl")
    if steps and "needed" not in steps[0]:
        raise SourceError(
            f"{run}/steps.jsonl has no `needed` dims (an older run): serve it again to plan"
        )
    return steps


def _num_blocks(run: Path, cfg: DictConfig) -> int:
    """The block pool the run had: configured, or as derived at start (metrics.json, else
    pipeline.log; a folder written by `run` directly keeps no log, and guessing the pool
    from max_num_seqs full rows counted another decode blocks axis than the run's)."""
    if cfg.num_blocks:
        return int(cfg.num_blocks)
    metrics = read_metrics(run) or {}
    if metrics.get("num_blocks"):
        return int(metrics["num_blocks"])
    log = run / "pipeline.log"
    for line in log.read_text(encoding="utf-8").splitlines() if log.is_file() else []:
        if '"pipeline_ready"' in line:
            return int(json.loads(line)["num_blocks"])
    return cfg.max_num_seqs * blocks_for(cfg.max_model_len, cfg.block_size)


def run_limits(run: Path) -> RunLimits:
    path = run / "resolved_config.yaml"
    if not path.is_file():
        raise SourceError(f"{run}: no resolved_config.yaml; give a folder the pipeline wrote")
    cfg = OmegaConf.create(read_mapping(path))
    scheduler: type[Scheduler] = get_class(cfg.scheduler._target_)
    given = {
        name: {key: cfg.metadata[name][key] for key in ("min", "step", "max")} for name in AXES
    }
    num_blocks = _num_blocks(run, cfg)
    prefix = bool(OmegaConf.select(cfg, "prefix_caching", default=False))
    axes = resolve_axes(
        given, cfg.block_size, cfg.max_tokens, cfg.max_num_seqs, cfg.max_model_len, num_blocks,
        prefix,
    )  # fmt: skip
    budget = OmegaConf.select(cfg, "scheduler.budget", default=Budget.padded)
    rule = StepRule(
        block_size=cfg.block_size,
        max_tokens=cfg.max_tokens,
        mixed=bool(scheduler.splits_prompts),
        padded_budget=budget == Budget.padded,
    )
    tops = axis_tops(rule, cfg.max_num_seqs, cfg.max_model_len, num_blocks, prefix)
    return RunLimits(rule=rule, axes=axes, tops=tops)


def axis_tops(
    rule: StepRule, max_num_seqs: int, max_model_len: int, num_blocks: int, prefix: bool
) -> dict[str, int]:
    """The largest value each bucket axis can take under the config: a plan ends every
    axis here, so no step the config allows misses. Prefill rows are at most the budget
    over one row's least cost; a chunk is at most the budget and the model length; with
    prefix caching, rows list their shared blocks each, so decode blocks are bounded by
    rows x a full row's blocks rather than by the pool."""
    bs, budget = rule.block_size, rule.max_tokens
    per_row = blocks_for(max_model_len, bs)
    chunk = budget // bs if rule.padded_budget else blocks_for(budget, bs)
    return {
        "prefill_batch": min(max_num_seqs, budget // bs if rule.padded_budget else budget),
        "prefill_seq": min(chunk, per_row) * bs,
        "prefill_blocks": per_row,
        "decode_batch": min(max_num_seqs, budget),
        "decode_blocks": decode_blocks_limit(max_num_seqs, per_row, num_blocks, prefix),
    }


def load_source(source: Path) -> tuple[list[Path], RunLimits, list[dict[str, Any]]]:
    """(runs, their shared limits, all their steps); runs must agree on the limits."""
    runs = find_runs(source)
    limits = [run_limits(run) for run in runs]
    for key in ("block_size", "max_tokens", "mixed", "padded_budget"):
        if len({getattr(lim.rule, key) for lim in limits}) > 1:
            raise SourceError(
                f"{source}: the jobs differ in {key}; a bucket set serves one config, so "
                "plan from the jobs that share it"
            )
    # the widest limits of any job: the plan serves them all
    tops = {name: max(lim.tops[name] for lim in limits) for name in AXES}
    limits[0].tops = tops
    return runs, limits[0], [step for run in runs for step in read_steps(run)]
