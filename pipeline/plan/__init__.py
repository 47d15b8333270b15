"""`python -m pipeline.plan`: devices, replicas, cards, $/hour and launch commands for a load.

Every job of the sweep (Hydra's grammar and launchers: `hydra/launcher=joblib` runs them in
parallel) runs a capacity search (pipeline/plan/capacity.py) on the simulated device and, with
`plan.target_rps` or `plan.target_concurrency`, sizes and checks the configuration for it
(pipeline/plan/target.py); once all have finished, the plan folder gets plan.md / plan.csv,
pareto.png, best.json and deploy/DEVICE/ for each device's best (pipeline/plan/report.py).
The user's guide: docs/planner.md.

    python -m pipeline.plan model=spec/llama31_8b hardware=h100,gaudi3 plan.target_rps=20 \\
        plan.prices.gaudi3=2.0 slo.ttft_ms=1000 slo.tpot_ms=50 max_tokens=2048,4096 \\
        hydra/launcher=joblib
"""

from __future__ import annotations

import structlog
from omegaconf import DictConfig

from pipeline.command import HydraCommand, Job, SweepOnFailure
from pipeline.config.checks import ConfigError, describe_model
from pipeline.disagg.config import check_layouts
from pipeline.plan.capability import capability_rule
from pipeline.plan.capacity import capacity_search
from pipeline.plan.capacity_report import print_result
from pipeline.plan.readiness import Readiness, readiness
from pipeline.plan.report import check_plan
from pipeline.plan.target import check_target, target_of
from pipeline.run_folder import artefacts
from pipeline.run_folder.reader import RunStatus
from pipeline.schema import schema_view
from stages.simulator.precision import Precision

log = structlog.get_logger("pipeline.plan")


def plan_job(cfg: DictConfig, job: Job) -> int:
    """One configuration's capacity search and, with a target, its sizing; a combination
    of the sweep the engines cannot deploy is a row, not a search."""
    artefacts.write_resolved_config(cfg, job.out_dir)  # a failed row shows its device and layout
    reason = layout_rule(cfg) or capability_rule(cfg)
    if reason:
        log.info("ruled_out", reason=reason)
        artefacts.write_metrics({"status": RunStatus.FAILED, "error": reason,
                                 "ruled_out": reason}, job.out_dir)  # fmt: skip
        return 0
    check_plan(cfg)
    start_up = replica_readiness(cfg, warmup_s=0.0)  # all but the capture or compile
    result = capacity_search(
        cfg,
        job.out_dir,
        max_warmup_s=schema_view(cfg).plan.max_warmup_s,
        start_up_s=start_up.ready_s,
    )
    warmup_s = float(result.get("predicted_warmup_s") or 0.0)
    result.update(replica_readiness(cfg, warmup_s).as_metrics())
    artefacts.write_metrics(result, job.out_dir)
    if target_of(cfg):
        result = check_target(cfg, job.out_dir, result)
        artefacts.write_metrics(result, job.out_dir)
    print_result(result, job.out_dir)
    return 0


# One failed job must not stop the plan: its metrics.json has the error, the table shows it.
COMMAND = HydraCommand(
    name="pipeline.plan",
    config_name="plan",
    run=plan_job,
    records_failures=True,
    sweep=SweepOnFailure.ALWAYS_GOES_ON,
)


def replica_readiness(cfg: DictConfig, warmup_s: float) -> Readiness:
    """A replica's start-up on each of its device's engines (pipeline/plan/readiness.py)."""
    spec, _ = describe_model(cfg)
    conf = schema_view(cfg)
    weights = Precision(conf.quantization, conf.kv_cache_dtype).model_weight_bytes(spec)
    pads = bool(conf.hardware.pads_to_buckets)
    engine = str(conf.engine.name) if "engine" in cfg else "native"
    return readiness(weights, float(conf.plan.load_gbs), warmup_s, pads, engine)


def layout_rule(cfg: DictConfig) -> str:
    """Why the configuration's ep / dp cannot be deployed (ep = 1 or tp x dp, experts split
    evenly: stages/simulator/expert_parallel.py; a disaggregated deployment's pools too);
    "" when it can, or when the model cannot be described here (the search
    reports that)."""
    try:
        spec, _ = describe_model(cfg)
    except ConfigError:
        return ""
    try:
        check_layouts(cfg, spec)
    except ConfigError as err:
        return f"layout: {err}"
    return ""
