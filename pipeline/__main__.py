"""`python -m pipeline`: compose the stages with Hydra and serve the workload."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
import structlog
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pipeline import artefacts, logs  # noqa: F401  (logs configures structlog)
from pipeline.checks import ConfigError
from pipeline.folder_lock import FolderBusy
from pipeline.run import run
from pipeline.run_folder import RunStatus
from pipeline.schema import register_schemas
from pipeline.signals import RunInterrupted

log = structlog.get_logger("pipeline")
register_schemas()


def _record_failure(status: RunStatus, message: str, out_dir: Path) -> None:
    """metrics.json says why the run ended, unless the folder cannot be written either."""
    try:
        artefacts.write_metrics({"status": status, "error": message}, out_dir)
    except artefacts.RunFolderError:
        pass


@hydra.main(version_base="1.3", config_path="pkg://pipeline.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)  # with resume, only a failure is noted here
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    structlog.contextvars.clear_contextvars()  # a joblib worker runs several jobs
    structlog.contextvars.bind_contextvars(job=hydra_cfg.job.num if multirun else 0)
    try:
        # As typed: an override's own `${...}` is text here, not resolved (which could take
        # for ever on references that double).
        typed = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)
        run(cfg, out_dir, overrides=[str(o) for o in typed] if isinstance(typed, list) else [])
    except RunInterrupted as stop:
        if not stop.recorded:  # stopped before serving began
            _record_failure(RunStatus.INTERRUPTED, str(stop), out_dir)
        # Exiting (not returning) ends a sweep too: the jobs after this one do not start.
        log.warning("run_interrupted", signal=str(stop), out_dir=str(out_dir))
        sys.exit(stop.exit_code)
    except Exception as err:
        known = isinstance(err, ConfigError | artefacts.RunFolderError)
        message = str(err) if known else f"{type(err).__name__}: {err}"
        if not isinstance(err, FolderBusy):  # the folder is another process's
            _record_failure(RunStatus.FAILED, message, out_dir)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if multirun:  # one failed job must not stop the sweep
            log.error("job_failed", error=message)
            return
        if known:
            print(f"Error: {message}", file=sys.stderr)
            sys.exit(2 if isinstance(err, ConfigError) else 1)
        raise


if __name__ == "__main__":
    try:
        main()
    except RunInterrupted as stop:  # a sweep's own process: its launcher stopped the jobs
        log.warning("sweep_interrupted", signal=str(stop))
        sys.exit(stop.exit_code)
