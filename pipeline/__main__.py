"""`python -m pipeline`: compose the stages with Hydra and serve the workload."""

from __future__ import annotations

from omegaconf import DictConfig

from pipeline.command import HydraCommand, Job, SweepOnFailure
from pipeline.run import run


def run_job(cfg: DictConfig, job: Job) -> int:
    """Serves one job into its folder (with resume, only a failure is noted there)."""
    run(cfg, job.out_dir, overrides=job.overrides)
    return 0


COMMAND = HydraCommand(
    name="pipeline",
    config_name="config",
    run=run_job,
    records_failures=True,
    sweep=SweepOnFailure.GOES_ON,
)

if __name__ == "__main__":
    COMMAND.main()
