"""The run folder's files: resolved config, generations, steps and metrics.

Everything is written as it happens and flushed line by line, so a run stopped by a signal,
a kill or a full disk leaves what it finished readable: generations.jsonl gets a line as
each request finishes (in finish order, each with its workload `index`) and is rewritten in
workload order at the end; steps.jsonl gets a line per step; whole files (metrics.json, the
final generations.jsonl) are replaced atomically, never left half written.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.checks import ConfigError
from pipeline.config.expansion import bounded_record
from pipeline.run_folder.folder_lock import FolderLock
from pipeline.run_folder.reader import (  # noqa: F401  (read_generations: the folder's reader)
    GENERATIONS,
    METRICS,
    RESOLVED_CONFIG,
    STEPS,
    RunFileError,
    config_path,
    read_generations,
    read_mapping,
)
from pipeline.run_folder.records import GenerationRecord, StepRecord

# RunFolderError: what the commands catch of a folder's writing, named here as before.
from pipeline.run_folder.run_files import RunFolderError, open_no_link, refuse_link, writing  # noqa: F401
from stages.scheduling.request import Request

# The error of a request a signal stopped; resuming the folder serves these again.
INTERRUPTED = "interrupted: the run stopped before this request finished"


def _umask() -> int:
    mask = os.umask(0o022)  # reading the mask means setting it: set it straight back
    os.umask(mask)
    return mask


def replace_text(path: Path, text: str) -> None:
    """Writes `path` whole or not at all: a temporary file beside it, then a rename."""
    replace_lines(path, [text.encode("utf-8")])


def replace_lines(path: Path, lines: Iterable[bytes]) -> None:
    """replace_text for encoded lines, written one after another (never joined: a trace
    run's generations are hundreds of megabytes)."""
    with writing(refuse_link(path)):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            with os.fdopen(fd, "wb") as f:
                f.writelines(lines)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_run_config(folder: Path) -> DictConfig | None:
    """A run folder's composed config, Hydra's own copy first; None if it has neither.
    RunFileError for a file that is not a config."""
    path = config_path(folder)
    if path is None:
        return None
    try:
        return OmegaConf.create(read_mapping(path))
    except OmegaConfBaseException as err:  # e.g. a date, which a config cannot hold
        raise RunFileError(f"{path} is not a config: {' '.join(str(err).split())}") from err


def write_resolved_config(cfg: DictConfig, out_dir: Path) -> None:
    replace_text(out_dir / RESOLVED_CONFIG, OmegaConf.to_yaml(cfg, resolve=True))


def json_line(value: dict[str, Any], ensure_ascii: bool = False) -> bytes:
    """One line of JSON, UTF-8. orjson writes floats some twenty times faster than json (a
    trace run's lines hold millions of token gaps), and bytes, which the run folder's files
    take as they are; json writes what orjson refuses (a lone surrogate, as its escape; an
    integer beyond 64 bits) and log-probabilities, which may be -inf (orjson would write
    null)."""
    if "logprobs" not in value:
        try:
            return orjson.dumps(value) + b"\n"
        except TypeError:
            pass
    text = json.dumps(value, ensure_ascii=ensure_ascii) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: UTF-8 cannot hold it, an escape can
        return (json.dumps(value, ensure_ascii=True) + "\n").encode("ascii")


class GenerationWriter:
    """Appends each request's line as it finishes; `finish` rewrites the file in workload
    order. `kept` are lines of an earlier run of the same folder (a resume)."""

    def __init__(self, out_dir: Path, tokenizer, kept: Iterable[dict[str, Any]] = ()) -> None:
        self.path = out_dir / GENERATIONS
        self.tokenizer = tokenizer
        self.lines: dict[int, bytes] = {}  # workload index -> its encoded line, made once
        with writing(self.path):
            self._file = open_no_link(self.path, "wb")
        for line in kept:
            self._append(line)

    def _append(self, line: dict[str, Any]) -> None:
        text = self.lines[line["index"]] = json_line(line)
        with writing(self.path):
            self._file.write(text)
            self._file.flush()

    def __call__(self, request: Request) -> None:
        if request.index not in self.lines:
            self._append(GenerationRecord.of(request, self.tokenizer).line())

    def close(self) -> None:
        with writing(self.path):
            self._file.close()

    def finish(self) -> None:
        """The whole file again, in workload order, replacing the finish-order one."""
        self.close()
        replace_lines(self.path, (self.lines[i] for i in sorted(self.lines)))


class StepWriter:
    """Appends one line per engine step as it happens, flushed at least every FLUSH_S
    seconds, so a run can be watched (a simulated run makes thousands of steps a second)."""

    FLUSH_S = 0.2

    def __init__(self, out_dir: Path, append: bool = False) -> None:
        self.path = out_dir / STEPS
        with writing(self.path):
            self._file = open_no_link(self.path, "ab" if append else "wb")
        self._flushed = 0.0

    def __call__(self, record: StepRecord) -> None:
        with writing(self.path):
            self._file.write(json_line(record.line(), ensure_ascii=True))
            now = time.monotonic()
            if now - self._flushed >= self.FLUSH_S:
                self._file.flush()
                self._flushed = now

    def close(self) -> None:
        with writing(self.path):
            self._file.close()


def write_metrics(metrics: dict[str, Any], out_dir: Path) -> None:
    """metrics.json, from bounded fields: one oversized field is noted, not the run lost."""
    replace_text(out_dir / METRICS, json.dumps(bounded_record(metrics), indent=2) + "\n")


def run_folder_problem(folder: Path) -> str | None:
    """Why the run folder could not take the run's files, or None. Creates nothing: the
    nearest existing folder on the way must be writable, and no file name taken by a
    directory."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"the run folder {folder} is under {existing}, which is a file: choose another one"
    if existing == folder:
        for name in (GENERATIONS, STEPS, METRICS, RESOLVED_CONFIG):
            path = folder / name
            if path.exists() and not path.is_file():
                return f"{path} is not a regular file: remove it or choose another run folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        return f"the run folder {folder} cannot be written ({existing}: {err.strerror or err})"
    return None


def _refuse_folder(folder: Path) -> None:
    problem = run_folder_problem(folder)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        sys.exit(2)


class RunFolderCheck(Callback):
    """Checks the run (or sweep) folder before Hydra makes it, so a folder under a file or on
    a read-only file system is one line and exit code 2, not Hydra's traceback; then holds
    the folder's lock, before Hydra writes its .hydra files there, so that a second run given
    the same folder is refused before it has written anything."""

    def __init__(self) -> None:
        self._locks: list[FolderLock] = []

    def __getstate__(self) -> dict[str, Any]:
        """A pool launcher's worker gets no locks: the sweep's process holds them."""
        return {"_locks": []}

    def _hold(self, folder: Path) -> None:
        _refuse_folder(folder)
        lock = FolderLock(folder)
        try:
            lock.acquire()
        except ConfigError as err:
            print(f"Error: {err}", file=sys.stderr)
            sys.exit(2)
        self._locks.append(lock)

    def _release(self) -> None:
        while self._locks:
            self._locks.pop().release()

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._hold(Path(config.hydra.run.dir))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._release()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._hold(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._release()
