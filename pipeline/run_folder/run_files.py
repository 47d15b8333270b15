"""Run-folder files opened safely: never through a symbolic link (a link in a run folder would
have its target truncated and overwritten), and an OSError turned into one line; the errors
of a folder's files, written (RunFolderError) and read back (RunFileError). Every file a
command writes (a run's, a plan's, a deploy folder's, a report's) goes through `write_file`
into a folder made by `output_folder`."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

from pipeline.config.checks import ConfigError


class RunFolderError(Exception):
    """A run-folder file that cannot be written; the message names the path and the reason."""


class RunFileError(ConfigError):
    """A run-folder file that cannot be read; the message is the one line the user sees."""


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turns an OSError (disk full, read-only, a directory in the way) into one line."""
    try:
        yield
    except OSError as err:
        raise RunFolderError(f"cannot write {path}: {err.strerror or err}") from err


_FLAGS = {
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "rb+": os.O_RDWR,
}


def _link_error(path: Path) -> RunFolderError:
    return RunFolderError(
        f"{path} is a symbolic link: a run writes no file through a link; remove it or "
        "choose another run folder"
    )


def refuse_link(path: Path) -> Path:
    """`path`, unless it is a symbolic link (then a RunFolderError, the link untouched)."""
    if path.is_symlink():
        raise _link_error(path)
    return path


def output_folder(path: Path) -> Path:
    """`path` made (with its parents) to write into; a RunFolderError if it is a symbolic
    link: a copied run folder's `deploy` linked elsewhere would have files written there."""
    with writing(path):
        refuse_link(path).mkdir(parents=True, exist_ok=True)
    return path


def write_file(path: Path, data: str | bytes, *, executable: bool = False) -> Path:
    """`path` written whole, never through a symbolic link (a RunFolderError naming it, its
    target untouched); `executable`: mode 0755, for a launch script."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with writing(path), open_no_link(path, "wb") as f:
        if executable:
            os.fchmod(f.fileno(), 0o755)
        f.write(payload)
    return path


def open_no_link(path: Path, mode: str) -> BinaryIO:
    """`path` opened as open(path, mode) would, except through a symbolic link (O_NOFOLLOW):
    a link in a run folder would have its target truncated and overwritten."""
    try:
        fd = os.open(path, _FLAGS[mode] | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _link_error(path) from None
        raise
    return cast(BinaryIO, os.fdopen(fd, mode))
