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

from omegaconf import DictConfig

from pipeline import artefacts
from pipeline.command import HydraCommand, Job, SweepOnFailure
from pipeline.plan.capacity import capacity_search
from pipeline.plan.capacity_report import print_result
from pipeline.plan.report import check_plan
from pipeline.plan.target import check_target, target_of


def plan_job(cfg: DictConfig, job: Job) -> int:
    """One configuration's capacity search and, with a target, its sizing."""
    check_plan(cfg)
    result = capacity_search(cfg, job.out_dir, max_warmup_s=cfg.plan.max_warmup_s)
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
