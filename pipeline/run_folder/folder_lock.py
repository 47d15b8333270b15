"""One writer per run folder: a run, a resume or a sweep holds an exclusive `fcntl` lock on
a file in its folder for as long as it writes there.

The operating system drops the lock when its holder exits, however it exits (a SIGKILL, a
crash), so a lock left by a killed process is simply taken by the next one; the pid in the
file is only there to name the holder in the refusal. The file is never removed: removing
it would let a third process lock a new file while the second still holds the old one.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from pipeline.config.checks import ConfigError

LOCK_FILE = ".pipeline.lock"


class FolderBusy(ConfigError):
    """Another process holds the folder; the message names it and its pid. The folder is
    the holder's: nothing may be written there, not even a note of the refusal."""


class FolderLock:
    """An exclusive lock on `folder`, re-entrant within one process: the run's folder check
    and the run itself both take it, and a second open of the same file would otherwise
    conflict with the first (flock locks belong to the open file, not the process)."""

    _held: dict[Path, tuple[int, int]] = {}  # folder -> (fd, depth), this process's locks

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder).resolve()

    def acquire(self) -> None:
        """Takes the lock, creating the folder; FolderBusy if another process holds it."""
        held = self._held.get(self.folder)
        if held is not None:
            self._held[self.folder] = (held[0], held[1] + 1)
            return
        path = self.folder / LOCK_FILE
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise ConfigError(
                f"cannot lock the run folder {self.folder} ({path}: {err.strerror or err}): "
                "make it writable or choose another folder"
            ) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise FolderBusy(
                f"the run folder {self.folder} is in use by process {holder} (a run or resume "
                "writing to it): wait for it to finish, or choose another folder"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)  # a stale holder's pid goes
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._held[self.folder] = (fd, 1)

    def release(self) -> None:
        held = self._held.get(self.folder)
        if held is None:
            return
        fd, depth = held
        if depth > 1:
            self._held[self.folder] = (fd, depth - 1)
            return
        del self._held[self.folder]
        os.close(fd)  # closing the file releases the lock

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _holder(fd: int) -> str:
    """The pid the holder wrote, or a placeholder while it has not written it yet."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else "(pid not yet written)"
