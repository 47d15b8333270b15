"""Every command's --help: what it does, its arguments and one example."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]


def commands() -> list[str]:
    """Every command of the pipeline package: the package itself and each subpackage that
    runs with `python -m` (has a __main__.py)."""
    mains = sorted((ROOT / "pipeline").glob("*/__main__.py"))
    return ["pipeline", *(f"pipeline.{path.parent.name}" for path in mains)]


def test_the_commands_are_found():
    assert {"pipeline", "pipeline.buckets", "pipeline.inspect", "pipeline.serve"} <= set(commands())


def listed_groups() -> dict[str, set[str]]:
    """The config groups and options `python -m pipeline --help` lists (its help template),
    with `prefix/{a,b}` expanded."""
    help_config = OmegaConf.load(ROOT / "conf/hydra/help/pipeline.yaml")
    template = OmegaConf.to_container(help_config)["template"]  # unresolved
    section = template.split("== Config groups (group=option) ==")[1].split("==")[0]
    groups: dict[str, set[str]] = {}
    for line in filter(None, map(str.strip, section.splitlines())):
        name, options = line.split(":", 1)
        group = name.split(" (")[0].lstrip("+")
        groups[group] = set()
        for option in options.split(", "):
            prefix, _, names = option.strip().partition("{")
            if names:
                groups[group] |= {prefix + n for n in names.rstrip("}").split(",")}
            else:
                groups[group].add(prefix)
    return groups


def test_the_help_lists_every_config_group_and_option():
    on_disk = {
        group.name: {str(p.relative_to(group).with_suffix("")) for p in group.rglob("*.yaml")}
        for group in (ROOT / "conf").iterdir()
        if group.is_dir() and group.name != "hydra"
    }
    assert listed_groups() == on_disk


@pytest.mark.slow
@pytest.mark.parametrize("module", commands())
def test_help_says_what_its_arguments_and_an_example(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"python -m {module}" in text  # names itself, not another command
    assert "xample" in text  # one example at least
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) >= 4 and not text.rstrip().endswith(("whether", "and", "the"))


def subcommands(module: str) -> list[str]:
    """The subcommands a command's usage line lists as {a,b,...} (none for most)."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT,
        timeout=120,
    )  # fmt: skip
    usage = done.stdout.split("\n\n", 1)[0]
    found = re.search(r"\{([a-z_,-]+)\}", usage)
    return found.group(1).split(",") if found else []


@pytest.mark.slow
@pytest.mark.parametrize("module", commands())
def test_every_subcommand_has_a_help(module):
    for sub in subcommands(module):
        done = subprocess.run(
            [sys.executable, "-m", module, sub, "--help"], capture_output=True, text=True,
            cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, f"{module} {sub} --help: {done.stderr[-400:]}"
        assert f"python -m {module} {sub}" in done.stdout and "xample" in done.stdout


def test_the_buckets_command_lists_its_subcommands():
    assert subcommands("pipeline.buckets") == ["plan", "show"]


@pytest.mark.slow
def test_an_exported_omp_num_threads_gives_no_paddle_warning():
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "4"}
    code = "import pipeline, paddle; print(paddle.get_device())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "OMP_NUM_THREADS" not in done.stderr and "WISELY" not in done.stderr
