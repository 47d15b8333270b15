"""`python -m pipeline`: compose the stages with Hydra and serve the workload."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
import structlog
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline import artefacts, logs  # noqa: F401  (logs configures structlog)
from pipeline.checks import ConfigError
from pipeline.run import run
from pipeline.schema import register_schemas

log = structlog.get_logger("pipeline")
register_schemas()


@hydra.main(version_base="1.3", config_path="pkg://pipeline.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    structlog.contextvars.clear_contextvars()  # a joblib worker runs several jobs
    structlog.contextvars.bind_contextvars(job=hydra_cfg.job.get("num", 0) if multirun else 0)
    try:
        run(cfg, out_dir)
    except Exception as err:
        message = str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
        artefacts.write_metrics({"status": "failed", "error": message}, out_dir)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if multirun:  # one failed job must not stop the sweep
            log.error("job_failed", error=message)
            return
        if isinstance(err, ConfigError):
            print(f"Error: {message}", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
