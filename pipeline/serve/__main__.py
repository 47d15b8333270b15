"""`python -m pipeline.serve [overrides]`: an OpenAI-compatible server on the configured
engine (any override of `python -m pipeline` applies), real or simulated.

    python -m pipeline.serve model=small serve.port=8000
    python -m pipeline.serve executor=simulated hardware=gaudi3 model=spec/llama3-8b

The run folder (Hydra's output dir) gets the batch run's files: generations.jsonl as each
request ends, steps.jsonl, metrics.json at shutdown. SIGTERM or Ctrl-C stop it gracefully
(in-flight requests get serve.shutdown_timeout_s to finish) with exit code 0.
"""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
import structlog
import uvicorn
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline import artefacts, logs  # noqa: F401  (logs configures structlog)
from pipeline.build import check_resolves, import_paddle
from pipeline.checks import ConfigError
from pipeline.executors import check_config, executor_of
from pipeline.run import slo_of
from pipeline.run_folder import RunStatus
from pipeline.schema import register_schemas
from pipeline.serve.api import create_app
from pipeline.serve.telemetry import Telemetry
from pipeline.serve.worker import EngineWorker

log = structlog.get_logger("pipeline.serve")
register_schemas()


def prepare(cfg: DictConfig, model_choice: str) -> None:
    """Checks the config as a run would, and fills in what a server derives: the model's
    name, and (on the real executor) a KV pool that holds max_num_seqs full-length requests,
    since a server has no workload to size it by."""
    check_resolves(cfg)
    executor = check_config(cfg)
    slo_of(cfg)  # a bad bound stops the server before anything is built
    if not cfg.serve.model_name:
        cfg.serve.model_name = model_choice
    if not cfg.num_blocks:
        cfg.num_blocks = executor.server_num_blocks(cfg)
    if not 0 < cfg.serve.port < 65536:
        raise ConfigError(f"serve.port={cfg.serve.port}: choose a port in 1..65535")
    if cfg.serve.max_waiting < 1 or cfg.serve.max_request_bytes < 1:
        raise ConfigError("serve.max_waiting and serve.max_request_bytes must be >= 1")
    if cfg.serve.trim_memory_s < 0:
        raise ConfigError(f"serve.trim_memory_s={cfg.serve.trim_memory_s}: use 0 (never) or more")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which tells the engine worker when a stop signal starts the
    shutdown (before in-flight responses get their serve.shutdown_timeout_s)."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_stop()
        await super().shutdown(sockets)


@contextmanager
def exit_quietly_on_signals() -> Iterator[None]:
    """uvicorn re-raises the stop signal it handled once it has shut down; with these
    handlers in place that ends nothing, and a graceful stop exits 0."""
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: None) for s in stops}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(cfg: DictConfig, out_dir: Path) -> int:
    """Runs the server until a stop signal; returns the exit code."""
    fatal: list[BaseException] = []
    settings = cfg.serve
    telemetry = Telemetry(settings.model_name)

    def on_fatal(err: BaseException) -> None:  # from the engine's thread
        fatal.append(err)
        server.should_exit = True

    def make_worker(loop) -> EngineWorker:
        return EngineWorker(cfg, out_dir, loop, telemetry, on_fatal)

    app = create_app(cfg, make_worker)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        # A backstop: the worker aborts what is left at shutdown_timeout_s, so the
        # responses end on their own before uvicorn would cancel them.
        timeout_graceful_shutdown=round(settings.shutdown_timeout_s) + 5,
    )
    server = DrainingServer(config, lambda: app.state.worker.drain())
    if executor_of(cfg).needs_paddle:
        import_paddle()  # before uvicorn's handlers: Paddle's own would replace them
    print(f"serving on http://{settings.host}:{settings.port} (run folder {out_dir})", flush=True)
    with exit_quietly_on_signals():
        server.run()
    if fatal:
        err = fatal[0]
        known = isinstance(err, ConfigError | artefacts.RunFolderError)
        message = str(err) if known else f"{type(err).__name__}: {err}"
        if not (out_dir / artefacts.METRICS).exists():
            artefacts.write_metrics({"status": RunStatus.FAILED, "error": message}, out_dir)
        print(f"Error: {message}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1
    return 0


@hydra.main(version_base="1.3", config_path="pkg://pipeline.conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        prepare(cfg, hydra_cfg.runtime.choices.get("model", "model"))
        artefacts.write_resolved_config(cfg, out_dir)
    except (ConfigError, artefacts.RunFolderError) as err:
        print(f"Error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(serve(cfg, out_dir))


if __name__ == "__main__":
    main()
