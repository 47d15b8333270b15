"""`python -m pipeline`: compose the stages with Hydra and serve the workload."""

from __future__ import annotations

from omegaconf import DictConfig

from pipeline.command import HydraCommand, Job, SweepOnFailure
from pipeline.job.run import run
from pipeline.run_folder.reader import RunStatus


def run_job(cfg: DictConfig, job: Job) -> int:
    """Serves one job into its folder (with resume, only a failure is noted there); a run
    whose every request failed exits 1 (a sweep's job lets the sweep go on)."""
    metrics = run(cfg, job.out_dir, overrides=job.overrides)
    return 1 if metrics.get("status") == RunStatus.FAILED and not job.multirun else 0


COMMAND = HydraCommand(
    name="pipeline",
    config_name="config",
    run=run_job,
    records_failures=True,
    sweep=SweepOnFailure.GOES_ON,
)

if __name__ == "__main__":
    COMMAND.main()
