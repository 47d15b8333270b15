"""A page opened in the distribution's Chromium, headless and offline: its DOM once the
scripts have run, what its console said, and a screenshot. No browser is downloaded: where
no `chromium` is installed (.ci/run installs Debian's), tests skip with the reason."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; .ci/run does)"
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # every request but the page's own file fails: the page must need none
    "--proxy-server=127.0.0.1:9",
    "--enable-logging=stderr",
    "--v=0",
    # scripts get this much (virtual) time before the DOM or the screenshot is taken
    "--virtual-time-budget=4000",
]
CONSOLE = re.compile(r":CONSOLE(?:\(\d+\)|:\d+)\] (.*)")
# what a failed script or a blocked request leaves on the console
TROUBLE = re.compile(r"Uncaught|Error|ERR_|Failed to load|Refused", re.IGNORECASE)


@dataclass(frozen=True)
class Opened:
    dom: str
    console: list[str]
    screenshot: Path

    @property
    def troubles(self) -> list[str]:
        return [line for line in self.console if TROUBLE.search(line)]


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def open_page(page: Path, work: Path, size: tuple[int, int] = (1400, 2200)) -> Opened:
    """The page's DOM and a screenshot, each from a fresh profile."""
    url = page.resolve().as_uri()
    dumped = _chromium(["--dump-dom", url], work / "profile-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    shot = work / "screenshot.png"
    taken = _chromium(
        [f"--window-size={size[0]},{size[1]}", f"--screenshot={shot}", url], work / "profile-shot"
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    console = [m.group(1) for m in CONSOLE.finditer(dumped.stderr + taken.stderr)]
    return Opened(dumped.stdout, console, shot)


def distinct_colours(png: Path) -> tuple[tuple[int, int], int, float]:
    """(size, distinct colours, share of pixels that are not the page's white)."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 24) or []
        white = sum(n for n, c in colours if c == (255, 255, 255))
        return rgb.size, len(colours), 1 - white / (rgb.size[0] * rgb.size[1])
