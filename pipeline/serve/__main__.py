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

import structlog
import uvicorn
from fastapi import FastAPI
from omegaconf import DictConfig

from pipeline.command import RUN_FAILURES, Failure, HydraCommand, Job, error_line, failure_of
from pipeline.config.checks import ConfigError
from pipeline.executors import check_config, executor_of
from pipeline.executors.build import check_resolves, import_paddle
from pipeline.job.run import slo_of
from pipeline.run_folder import artefacts
from pipeline.run_folder.reader import RunStatus
from pipeline.schema import ServeConf, schema_view
from pipeline.serve.api import create_app
from pipeline.serve.connections import guarded_h11
from pipeline.serve.derived import model_name, serve_settings, size_kv_pool
from pipeline.serve.telemetry import Telemetry
from pipeline.serve.worker import EngineWorker

log = structlog.get_logger("pipeline.serve")


def prepare(cfg: DictConfig, model_choice: str) -> str | None:
    """Checks the config as a run would, and fills in what a server derives: the model's
    name, and (on the real executor) a KV pool sized by its memory budget, since a server
    has no workload to size it by; returns the line that says the pool's size."""
    check_resolves(cfg)
    executor = check_config(cfg)
    slo_of(cfg)  # a bad bound stops the server before anything is built
    cfg.serve.model_name = model_name(cfg, model_choice)
    check_settings(serve_settings(cfg))
    return size_kv_pool(cfg, executor.server_num_blocks(cfg))


def check_settings(settings: ServeConf) -> None:
    """The server's own bounds, each a one-line error."""
    if not 0 < settings.port < 65536:
        raise ConfigError(f"serve.port={settings.port}: choose a port in 1..65535")
    if min(settings.max_waiting, settings.max_request_bytes, settings.max_connections) < 1:
        raise ConfigError(
            "serve.max_waiting, serve.max_request_bytes and serve.max_connections must be >= 1"
        )
    if settings.trim_memory_s < 0:
        raise ConfigError(f"serve.trim_memory_s={settings.trim_memory_s}: use 0 (never) or more")
    timeouts = {
        "header_timeout_s": settings.header_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "shutdown_timeout_s": settings.shutdown_timeout_s,
    }
    for key, seconds in timeouts.items():
        if not 0 < seconds <= 86400:
            raise ConfigError(f"serve.{key}={seconds}: give seconds in (0, 86400]")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which tells the engine worker when a stop signal starts the
    shutdown (before in-flight responses get their serve.shutdown_timeout_s)."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_stop()
        await super().shutdown(sockets)


def stopped_before_serving(signum: int, frame: object) -> None:
    """A stop signal before the server runs (Paddle, imported with this module, installs
    handlers that print a C++ stack): one line, and the signal's exit code."""
    print(f"stopped by {signal.Signals(signum).name} before serving", file=sys.stderr)
    raise SystemExit(128 + signum)


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
    settings = serve_settings(cfg)
    telemetry = Telemetry(settings.model_name)

    def on_fatal(err: BaseException) -> None:  # from the engine's thread
        fatal.append(err)
        server.should_exit = True

    def make_worker(loop) -> EngineWorker:
        return EngineWorker(cfg, out_dir, loop, telemetry, on_fatal)

    app = create_app(settings, schema_view(cfg).max_model_len, make_worker)
    server = DrainingServer(uvicorn_config(app, settings), lambda: app.state.worker.drain())
    if executor_of(cfg).needs_paddle:
        import_paddle()  # before uvicorn's handlers: Paddle's own would replace them
    sock = listening_socket(settings.host, settings.port)  # a port in use: exit 2, no run
    print(f"serving on http://{settings.host}:{settings.port} (run folder {out_dir})", flush=True)
    with exit_quietly_on_signals():
        server.run(sockets=[sock])
    return exit_code(fatal[0], out_dir) if fatal else 0


def uvicorn_config(app: FastAPI, settings: ServeConf) -> uvicorn.Config:
    """uvicorn with the server's connection limits: request heads within
    serve.header_timeout_s, serve.max_connections open at most."""
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        http=guarded_h11(settings.header_timeout_s),
        limit_concurrency=settings.max_connections,
        # A backstop: the worker aborts what is left at shutdown_timeout_s, so the
        # responses end on their own before uvicorn would cancel them.
        timeout_graceful_shutdown=round(settings.shutdown_timeout_s) + 5,
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything says it serves."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ConfigError(
            f"serve.host={host} serve.port={port} cannot be bound ({err.strerror}): "
            "choose another serve.port, or stop what listens there"
        ) from None
    sock.set_inheritable(True)
    return sock


def exit_code(err: BaseException, out_dir: Path) -> int:
    """The engine's fatal error as one line on stderr and in metrics.json (where the disk
    allows) with a run's exit code: 2 for a config error, 1 otherwise."""
    failure = failure_of(RUN_FAILURES, err)
    message = error_line(RUN_FAILURES, err)
    try:
        if not (out_dir / artefacts.METRICS).exists():
            artefacts.write_metrics({"status": RunStatus.FAILED, "error": message}, out_dir)
    except (OSError, artefacts.RunFolderError) as write_err:
        print(f"Error: metrics.json not written: {write_err}", file=sys.stderr)
    print(f"Error: {message}", file=sys.stderr)
    return failure.code if failure else 1


def serve_job(cfg: DictConfig, job: Job) -> int:
    """Checks the config, then serves until a stop signal; returns the exit code."""
    pool = prepare(cfg, job.choices.get("model", "model"))
    artefacts.write_resolved_config(cfg, job.out_dir)
    if pool:
        print(pool, flush=True)
    return serve(cfg, job.out_dir)


COMMAND = HydraCommand(
    name="pipeline.serve",
    config_name="serve",
    run=serve_job,
    failures=(Failure((ConfigError, artefacts.RunFolderError), 2),),
)

if __name__ == "__main__":
    for stop in (signal.SIGINT, signal.SIGTERM):  # in place of Paddle's, from the imports
        signal.signal(stop, stopped_before_serving)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # see __init__
    COMMAND.main()
