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

import os
from pathlib import Path

import hydra
import structlog
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline import artefacts, logs  # noqa: F401  (logs configures structlog)
from pipeline.checks import ConfigError, describe_model
from pipeline.plan.capacity import capacity_search
from pipeline.plan.capacity_report import print_result
from pipeline.plan.report import check_plan
from pipeline.plan.target import check_target, target_of
from pipeline.run_folder import RunStatus
from pipeline.schema import register_schemas
from stages.simulator.expert_parallel import ExpertParallel, check_layout

log = structlog.get_logger("pipeline.plan")
register_schemas()


@hydra.main(version_base="1.3", config_path="pkg://pipeline.conf", config_name="plan")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    structlog.contextvars.clear_contextvars()  # a joblib worker runs several jobs
    job = hydra_cfg.job.get("num", 0)  # type: ignore[attr-defined]  # a DictConfig at run time
    structlog.contextvars.bind_contextvars(job=job)
    reason = layout_rule(cfg)
    if reason:  # a combination of the sweep the engines cannot deploy: a row, not a search
        log.info("ruled_out", reason=reason)
        artefacts.write_resolved_config(cfg, out_dir)  # the row shows its device and layout
        artefacts.write_metrics({"status": RunStatus.FAILED, "error": reason,
                                 "ruled_out": reason}, out_dir)  # fmt: skip
        return
    try:
        check_plan(cfg)
        result = capacity_search(cfg, out_dir, max_warmup_s=cfg.plan.max_warmup_s)
        if target_of(cfg):
            result = check_target(cfg, out_dir, result)
            artefacts.write_metrics(result, out_dir)
        print_result(result, out_dir)
    except Exception as err:  # one failed job must not stop the plan; the table shows it
        known = isinstance(err, ConfigError | artefacts.RunFolderError)
        message = str(err) if known else f"{type(err).__name__}: {err}"
        try:
            artefacts.write_metrics({"status": RunStatus.FAILED, "error": message}, out_dir)
        except artefacts.RunFolderError:
            pass
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        log.error("job_failed", error=message)


def layout_rule(cfg: DictConfig) -> str:
    """Why the configuration's ep / dp cannot be deployed (ep = 1 or tp x dp, experts split
    evenly: stages/simulator/expert_parallel.py); "" when it can, or when the model cannot
    be described here (the search reports that)."""
    try:
        spec, _ = describe_model(cfg)
        layout = ExpertParallel(int(cfg.ep), int(cfg.dp), float(cfg.ep_imbalance))
        check_layout(spec, int(cfg.tp), layout)
    except ConfigError:
        return ""
    except ValueError as err:
        return f"layout: {err}"
    return ""
