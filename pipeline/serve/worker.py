"""The engine in its own thread: requests in between steps, tokens out after each step.

The HTTP handlers (on the asyncio loop) `submit` requests and `abort` those whose clients
left; the engine thread drains both from the `Inbox` before every step (an idle engine waits
on it), and hands each step's new tokens back through the request's asyncio queue with
`loop.call_soon_threadsafe`, as soon as the step has run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from omegaconf import DictConfig

from pipeline.executors import build_engine
from pipeline.executors.allocator import HeapTrimmer
from pipeline.job.engine import Arrivals, Engine
from pipeline.job.serving import Ending, Hooks, serve_and_summarise
from pipeline.run_folder.reader import RunStatus
from pipeline.run_folder.records import StepRecord
from pipeline.schema import schema_view
from pipeline.serve.folder import ServerFiles, folder_metrics
from pipeline.serve.telemetry import Telemetry
from stages.scheduling.request import Request

log = structlog.get_logger(__name__)

STOPPED = "aborted: the server stopped before this request finished"


class Inbox:
    """The server's request source: thread-safe, drained by the engine before each step."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._new: list[Request] = []
        self._aborted: list[tuple[Request, str]] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self._new)

    def submit(self, request: Request) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError("the server is stopping")
            self._new.append(request)
            self._ready.notify()

    def abort(self, request: Request, reason: str) -> None:
        with self._ready:
            self._aborted.append((request, reason))
            self._ready.notify()

    def close(self) -> None:
        """No new request from now on; the engine ends once it has nothing left."""
        with self._ready:
            self._closed = True
            self._ready.notify()

    def take(self, now: float, idle: bool) -> Arrivals | None:
        with self._ready:
            while idle and not (self._new or self._aborted or self._closed):
                self._ready.wait()
            if idle and self._closed and not (self._new or self._aborted):
                return None
            arrivals = Arrivals(self._new, self._aborted)
            self._new, self._aborted = [], []
            return arrivals


@dataclass
class Finished:
    """The request ended; `ids` are its output tokens not yet delivered."""

    ids: list[int]


@dataclass
class Stream:
    """One request's way back to its HTTP handler: token lists, then a Finished."""

    request: Request
    streamed: bool  # whether tokens go out step by step, or all with the Finished
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: int = 0  # output tokens handed to the queue (engine thread only)


class EngineWorker:
    """Builds the engine, warms it up and serves the Inbox in a thread of its own, writing
    the run folder as it goes and its metrics.json when the engine stops."""

    def __init__(
        self,
        cfg: DictConfig,
        out_dir: Path,
        loop: asyncio.AbstractEventLoop,
        telemetry: Telemetry,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.loop = loop
        self.telemetry = telemetry
        self.on_fatal = on_fatal
        self.inbox = Inbox()
        self.streams: dict[int, Stream] = {}  # by the request's seq_id
        self.engine: Engine | None = None
        self.ready = threading.Event()
        self.draining = False  # a stop signal came: in-flight requests finish, none start
        self.failed: str | None = None
        self.engine_error: BaseException | None = None
        self.settings = schema_view(cfg).serve
        self.heap = HeapTrimmer(self.settings.trim_memory_s)
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)

    # -- the HTTP side (event loop thread) --------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests handed in and not yet running."""
        return len(self.inbox) + (len(self.engine.scheduler.waiting) if self.engine else 0)

    def submit(self, request: Request, streamed: bool) -> Stream:
        stream = Stream(request, streamed)
        self.streams[request.seq_id] = stream
        try:
            self.inbox.submit(request)
        except RuntimeError:
            del self.streams[request.seq_id]
            raise
        return stream

    def abort(self, request: Request, reason: str) -> None:
        self.inbox.abort(request, STOPPED if self.draining else reason)

    def drain(self) -> None:
        """A stop signal came: /health says 503, no new request is taken, and what is still
        in flight after serve.shutdown_timeout_s is aborted (its client gets the error)."""
        self.draining = True
        self.ready.clear()
        self.loop.call_later(self.settings.shutdown_timeout_s, self.abort_all)

    def abort_all(self) -> None:
        for stream in list(self.streams.values()):
            self.inbox.abort(stream.request, STOPPED)

    def stop(self, timeout_s: float) -> None:
        """Ends every request still in flight, then waits for the engine to stop."""
        self.ready.clear()
        self.inbox.close()
        self.abort_all()
        self._thread.join(timeout_s)

    # -- the engine thread -------------------------------------------------------------------
    def _main(self) -> None:
        """Loads, warms up and serves; any error on the way ends the server (on_fatal),
        after every open request has had its answer and the folder its metrics.json where
        the disk allows."""
        try:
            engine = self._load()
            files = ServerFiles(self.out_dir, engine.tokenizer)
        except BaseException as err:
            self.failed = str(err)
            self.on_fatal(err)
            return
        try:
            served = serve_and_summarise(
                self.cfg, engine, lambda: self._serve(engine, files), self._open_requests,
                lambda duration, warmup_s, status: folder_metrics(
                    self.cfg, engine, self.out_dir, duration, warmup_s, status, self.failed
                ),
                self.out_dir, ended_by=self._engine_failed,
                hooks=Hooks(
                    lambda warmup_s: self._ready(engine, warmup_s),
                    lambda request: self._answer(request, files),
                    files.close,
                ),
            )  # fmt: skip
            fatal = served.stopped_by
        except Exception as err:  # noqa: BLE001 - a full disk: the exit code says it failed
            log.error("metrics_not_written", error=f"{type(err).__name__}: {err}")
            fatal = self.engine_error or err
            self.failed = self.failed or f"{type(err).__name__}: {err}"
        if fatal is not None:
            self.on_fatal(fatal)

    def _ready(self, engine: Engine, warmup_s: float) -> None:
        """Warm: requests are taken from now on, timed by a clock that starts now."""
        self.engine = engine
        self.telemetry.watch(engine)
        engine.clock.restart()
        self.ready.set()
        log.info("server_ready", warmup_s=round(warmup_s, 3))

    def _serve(self, engine: Engine, files: ServerFiles) -> float:
        return engine.loop(
            self.inbox,
            on_step=lambda record: self._on_step(record, files),
            on_finish=lambda request: self._on_finish(request, files),
            on_tokens=self._on_tokens,
        )

    def _engine_failed(self, err: BaseException) -> Ending:
        """The engine broke (or its files did): every open request gets the error."""
        self.engine_error = err
        self.failed = f"{type(err).__name__}: {err}"
        log.error("engine_failed", error=self.failed)
        self.ready.clear()
        self.inbox.close()
        return Ending(RunStatus.FAILED, f"the engine failed: {self.failed}", in_warmup=True)

    def _open_requests(self) -> list[Request]:
        return [stream.request for stream in self.streams.values()]

    def _answer(self, request: Request, files: ServerFiles) -> None:
        """An open request the engine's error ended: its client hears of it even where its
        generations.jsonl line cannot be written (a full disk)."""
        try:
            files.generations(request)
        except Exception as err:  # noqa: BLE001 - the client's answer comes first
            log.warning("generation_not_written", id=request.id, error=str(err))
        stream = self.streams.pop(request.seq_id, None)
        if stream is not None:
            self._deliver(stream.queue.put_nowait, Finished(request.output_ids[stream.sent :]))

    def _load(self) -> Engine:
        # A simulated device's predicted step times pass on the wall (the digital twin).
        engine, _ = build_engine(self.cfg, paced=True)
        return engine

    def _on_step(self, record: StepRecord, files: ServerFiles) -> None:
        files.steps(record)
        self.telemetry.observe_step(record)
        self.heap.maybe_trim()

    def _on_tokens(self, requests: list[Request]) -> None:
        batch = []
        for r in requests:
            stream = self.streams.get(r.seq_id)
            if stream is not None and stream.streamed and len(r.output_ids) > stream.sent:
                batch.append((stream.queue, r.output_ids[stream.sent :]))
                stream.sent = len(r.output_ids)
        if batch:
            self._deliver(_put_each, batch)

    def _on_finish(self, request: Request, files: ServerFiles) -> None:
        files.generations(request)
        self.telemetry.observe_finish(request)
        stream = self.streams.pop(request.seq_id, None)
        if stream is not None:
            self._deliver(stream.queue.put_nowait, Finished(request.output_ids[stream.sent :]))

    def _deliver(self, fn: Callable, arg: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


def _put_each(batch: list[tuple[asyncio.Queue, list[int]]]) -> None:
    for queue, ids in batch:
        queue.put_nowait(ids)
