"""What every executor's build shares: a stage from its config node, the checks that every
key resolves, the workload, and Paddle loaded without losing the signal handlers in place
(the executors themselves: pipeline.executors)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import structlog
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from pipeline.config.checks import ConfigError
from pipeline.config.expansion import check_expansion
from stages.interfaces import Tokenizer, Workload
from stages.scheduling.request import Request
from stages.workload import bound_arrivals

log = structlog.get_logger(__name__)


def build(node: DictConfig, **runtime: Any) -> Any:
    """Instantiates one stage; a constructor's ValueError becomes a one-line config error."""
    try:
        return instantiate(node, **runtime)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ValueError):
            raise ConfigError(str(cause)) from err
        raise


def check_resolves(cfg: DictConfig) -> None:
    """Every key is set and every interpolation resolves (e.g. model.path for model=hf, and
    tokenizer.path, which defaults to it), or one line names the key; no value may expand
    beyond bounds through what it refers to."""
    check_expansion(cfg)
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is not set: give {err.full_key}=...") from err
    except InterpolationResolutionError as err:
        reason = str(err.msg).splitlines()[0]
        raise ConfigError(
            f"{err.full_key} does not resolve ({reason}): give {err.full_key}=..."
        ) from err


def load_workload(cfg: DictConfig, tokenizer: Tokenizer) -> tuple[Workload, list[Request]]:
    """The workload and its requests, every arrival held to the one bound."""
    workload: Workload = build(cfg.workload)
    try:
        requests = workload.load(tokenizer)
    except OSError as err:  # its file removed or made unreadable since it was checked
        raise ConfigError(
            f"workload: {err.filename or 'its file'} cannot be read ({err.strerror or err}): "
            "check workload.path"
        ) from err
    bound_arrivals(requests)
    return workload, requests


def import_paddle() -> None:
    """Loads Paddle, which a simulated run never does. Loading it installs Paddle's own
    C-level handlers for SIGINT, SIGTERM and other signals, which end the process with a
    C++ stack: in the main thread the stop signals wait (blocked) while it loads and the
    Python handlers in place are put back before they are let through; a command loads
    Paddle before installing its own (another thread cannot put them back). Leaves the
    calling thread in Paddle's eager mode."""
    stops = {signal.SIGINT, signal.SIGTERM}
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in stops}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops) if main else set()
    try:
        import paddle
    finally:
        if main:
            for signum, handler in handlers.items():
                if handler is not None:
                    signal.signal(signum, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a pending stop: ours
    if not paddle.in_dynamic_mode():
        # Paddle's eager mode is per thread, set up in the thread that imported it and the
        # main one: another thread that builds an engine (a second server's engine thread
        # in one process) would otherwise get static-graph values.
        paddle.disable_static()
