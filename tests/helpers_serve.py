"""A real server for the tests: the app, uvicorn with the server's own connection limits
(pipeline.serve's uvicorn_config) on a port the OS picked on 127.0.0.1, in a thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from pipeline.serve.__main__ import prepare, uvicorn_config
from pipeline.serve.api import create_app
from pipeline.serve.derived import serve_settings
from pipeline.serve.telemetry import Telemetry
from pipeline.serve.worker import EngineWorker
from tests.helpers import make_config


@dataclass
class Served:
    url: str
    worker: EngineWorker
    fatal: list[BaseException] = field(default_factory=list)


@contextmanager
def live_server(
    overrides: list[str], out_dir: Path, choice: str = "tiny", wait_ready: bool = True
) -> Iterator[Served]:
    """The server of `python -m pipeline.serve overrides`; yields once /health is ready (or
    at once, wait_ready=False). Fatal engine errors are kept in Served.fatal."""
    cfg = make_config(overrides)
    prepare(cfg, choice)
    fatal: list[BaseException] = []
    workers: list[EngineWorker] = []

    def make_worker(loop: asyncio.AbstractEventLoop) -> EngineWorker:
        worker = EngineWorker(cfg, out_dir, loop, Telemetry(choice), fatal.append)
        workers.append(worker)
        return worker

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    settings = serve_settings(cfg)
    app = create_app(settings, cfg.max_model_len, make_worker)
    server = uvicorn.Server(uvicorn_config(app, settings))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        deadline = time.monotonic() + 120
        while not workers or (wait_ready and not (workers[0].ready.is_set() or fatal)):
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        yield Served(url, workers[0], fatal)
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
