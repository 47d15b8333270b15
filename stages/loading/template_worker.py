"""Chat templates rendered in a child process with a time, memory and output limit.

A template comes with the model file, so it is hostile input: jinja2's sandbox stops it from
calling into Python, but not from looping for hours (two nested loops of 100,000) or building
a string of gigabytes. Here each render runs in one long-lived child process
(`python -m stages.loading.template_worker`) with an address-space limit, writes its output through
`Template.generate` and stops at MAX_OUTPUT_CHARS, and is killed at RENDER_TIMEOUT_S; the
next render starts a fresh child. The caller's thread waits on a pipe, never on the template.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_TIMEOUT_S = 2.0  # a real template renders in milliseconds
STARTUP_TIMEOUT_S = 60.0  # the child's interpreter start, kept out of the render's limit
MAX_OUTPUT_CHARS = 4_000_000  # a prompt longer than any context window
MEMORY_LIMIT_BYTES = 1 << 30  # the child's address space
READY = b"ready\n"  # the child's first line: set up and waiting for requests


def _raise(message: str) -> None:
    raise TemplateError(message)


@lru_cache(maxsize=8)
def compiled(template: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


class TemplateRenderer:
    """The parent's side: one child at a time, restarted after a render it had to kill."""

    def __init__(self, timeout_s: float = RENDER_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None

    def render(self, template: str, variables: dict[str, Any]) -> str:
        """The template's text; ValueError where it fails, runs too long or writes too much."""
        request = json.dumps({"template": template, "variables": variables}).encode() + b"\n"
        with self._lock:
            child = self._start()
            try:
                assert child.stdin is not None
                child.stdin.write(request)
                child.stdin.flush()
                line = self._read_line(child)
            except (OSError, ValueError):
                self._kill()
                raise
        reply = json.loads(line)
        if "error" in reply:
            raise ValueError(f"the chat template failed: {reply['error']}")
        return reply["text"]

    def _start(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "stages.loading.template_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            # A loaded machine may take seconds to start Python; only the render is timed.
            if self._read_line(self._child, STARTUP_TIMEOUT_S) != READY:
                self._kill()
                raise ValueError("the chat template's renderer did not start")
        return self._child

    def _read_line(self, child: subprocess.Popen, timeout_s: float | None = None) -> bytes:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], timeout_s or self.timeout_s)
        if not ready:
            raise ValueError(
                f"the chat template did not finish within {self.timeout_s:g} s: "
                "fix the model's tokenizer.chat_template, or serve a model without one"
            )
        line = child.stdout.readline()
        if not line:
            raise ValueError(
                "the chat template's renderer ended (beyond its "
                f"{MEMORY_LIMIT_BYTES >> 20} MiB or time limit): fix the model's chat template"
            )
        return line

    def _kill(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None

    def close(self) -> None:
        with self._lock:
            self._kill()


def _render(template: str, variables: dict[str, Any]) -> dict[str, str]:
    try:
        parts, size = [], 0
        for part in compiled(template).generate(**variables):
            size += len(part)
            if size > MAX_OUTPUT_CHARS:
                return {"error": f"it wrote more than {MAX_OUTPUT_CHARS:,} characters"}
            parts.append(part)
        return {"text": "".join(parts)}
    except TemplateError as err:  # the sandbox's SecurityError is one too
        return {"error": str(err)}
    except (MemoryError, RecursionError) as err:
        return {"error": f"{type(err).__name__}: it needs more than the limit allows"}


def _out_of_time(signum: int, frame: object) -> None:
    raise TimeoutError


def main() -> None:
    """Renders each request line; a render also stops itself at twice the parent's limit,
    and the child dies with its parent (Linux), so no orphan renders on for ever."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGALRM, _out_of_time)
    out = os.fdopen(sys.stdout.fileno(), "wb", buffering=0)
    out.write(READY)
    for raw in sys.stdin.buffer:
        request = json.loads(raw)
        signal.setitimer(signal.ITIMER_REAL, 2 * RENDER_TIMEOUT_S)
        try:
            reply = _render(request["template"], request["variables"])
        except TimeoutError:
            reply = {"error": f"it ran beyond {2 * RENDER_TIMEOUT_S:g} s"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    main()
