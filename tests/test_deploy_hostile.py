"""What a command writes cannot be turned against its user: a launch script runs only the
server it names (no id or path breaks out of a line, a comment included), no file is written
through a symbolic link (the link is a one-line error, its target untouched), and a copied
run folder's odd files are one-line errors, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.deploy import main as deploy_main
from pipeline.plan.report import build_plan_report
from pipeline.run_folder.run_files import RunFolderError, write_file
from tests.test_plan import make_job, resolved

PLAN_SETTINGS = {"objective": "goodput_per_card", "prices": {}, "max_warmup_s": 600,
                 "model_id": ""}  # fmt: skip


def run_folder(parent: Path, name: str = "run", **config_changes) -> Path:
    """A run folder as the pipeline leaves one: its resolved config and metrics.json."""
    folder = parent / name
    folder.mkdir(parents=True)
    config = {**resolved("gaudi2"), **config_changes}
    (folder / "resolved_config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.json").write_text(json.dumps({"status": "ok", "num_blocks": 100}))
    return folder


def one_line_error(capsys) -> str:
    """The one `Error:` line on stderr (a warning line of the deployment may precede it)."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def run_header(script: Path, cwd: Path) -> None:
    """The script's lines up to its `exec`, run by bash: what would run before the server."""
    lines = script.read_text().split("\nexec ")[0]
    subprocess.run(["bash", "-c", lines], cwd=cwd, check=False, timeout=30)


# ------------------------------------------------------------------- case 1: injection


@pytest.mark.parametrize("model", ["x\ntouch PWNED #", "x\rtouch PWNED", "x\x1b[2J"])
def test_a_model_id_with_a_control_character_is_refused(tmp_path, capsys, model):
    folder = run_folder(tmp_path)
    assert deploy_main([str(folder), "--model", model]) == 2
    assert "control character" in one_line_error(capsys)
    assert not (folder / "deploy").exists() and not (tmp_path / "PWNED").exists()


def test_a_run_path_or_config_with_a_newline_is_refused(tmp_path, capsys):
    folder = run_folder(tmp_path, "r\ntouch PWNED #")
    assert deploy_main([str(folder)]) == 2
    assert "control character" in one_line_error(capsys)
    copied = run_folder(tmp_path, "copied", model={**resolved()["model"], "name": "m\ntouch P"})
    assert deploy_main([str(copied)]) == 2
    assert "control character" in one_line_error(capsys)
    assert not (folder / "deploy").exists() and not (copied / "deploy").exists()


def test_quotes_and_dollars_in_an_id_or_path_stay_text(tmp_path, capsys):
    """The shell reads each value back as written: headers run nothing, the model id is
    the one argument the server gets."""
    folder = run_folder(tmp_path, "r $(touch PWNED1) 'x")
    model = "org/m $(touch PWNED2) `touch PWNED3` ' \" ;touch PWNED4"
    assert deploy_main([str(folder), "--model", model]) == 0
    work = tmp_path / "work"
    work.mkdir()
    scripts = sorted((folder / "deploy").glob("*.sh"))
    assert scripts
    for script in scripts:
        run_header(script, work)
        first = script.read_text().splitlines()[1]
        assert first.startswith("# ") and "\n" not in first
    assert sorted(os.listdir(work)) == []
    vllm = (folder / "deploy" / "vllm-gaudi.sh").read_text()
    command = vllm[vllm.index("exec vllm serve ") :].split(" \\\n")[0]
    assert subprocess.run(["bash", "-c", f"printf %s {command.split(' ', 3)[3]}"],
                          capture_output=True, text=True, cwd=work).stdout == model  # fmt: skip


# ------------------------------------------------------------------- case 2: links


def test_deploy_writes_nothing_through_a_link(tmp_path, capsys):
    folder = run_folder(tmp_path)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    target.chmod(0o600)
    out = tmp_path / "out"
    out.mkdir()
    (out / "vllm-gaudi.sh").symlink_to(target)
    assert deploy_main([str(folder), "--out", str(out)]) == 2
    assert "symbolic link" in one_line_error(capsys)
    assert target.read_text() == "precious\n" and target.stat().st_mode & 0o777 == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "deploy").symlink_to(elsewhere)  # the default folder, linked
    assert deploy_main([str(folder)]) == 2
    assert "symbolic link" in one_line_error(capsys)
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize(
    "name", ["plan.md", "plan.csv", "pareto.png", "best.json", "deploy", "deploy/gaudi2"]
)
def test_a_plan_writes_nothing_through_a_link(tmp_path, name):
    plan = tmp_path / "plan"
    for num in range(2):
        make_job(plan, num, tp=1 + num, goodput=4.0 + num, tokens=1000, tpot_ms=20)
    target = tmp_path / "victim"
    target.mkdir() if name.startswith("deploy") else target.write_text("precious\n")
    (plan / name).parent.mkdir(parents=True, exist_ok=True)
    (plan / name).symlink_to(target)
    with pytest.raises(RunFolderError, match="symbolic link"):
        build_plan_report(plan, PLAN_SETTINGS)
    if target.is_dir():
        assert os.listdir(target) == []
    else:
        assert target.read_text() == "precious\n"


def test_a_summary_writes_nothing_through_a_link(tmp_path):
    from pipeline import summary

    sweep = tmp_path / "sweep"
    make_job(sweep, 0, tp=1, goodput=4.0, tokens=1000, tpot_ms=20)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    for name in ("summary.csv", "summary.md", "summary.png"):
        (sweep / name).unlink(missing_ok=True)
        (sweep / name).symlink_to(target)
        with pytest.raises(summary.SummaryError, match="symbolic link"):
            summary.build_summary(sweep)
        assert target.read_text() == "precious\n"
        (sweep / name).unlink()
        summary.build_summary(sweep)  # the link removed: written, as a file


def test_the_writer_writes_whole_files_with_the_mode_asked(tmp_path):
    path = write_file(tmp_path / "a.sh", "echo\n", executable=True)
    assert path.read_text() == "echo\n" and path.stat().st_mode & 0o777 == 0o755
    write_file(path, b"x")  # a shorter file replaces a longer one whole
    assert path.read_bytes() == b"x"


def test_no_module_writes_a_file_but_through_the_writer():
    """Every file a command writes goes through pipeline/run_folder/run_files.py (a text search: a
    new write_text, open(..., "w") or savefig(path) would bypass the link check)."""
    root = Path(__file__).resolve().parents[1] / "pipeline"
    bypasses = (".write_text(", ".write_bytes(", 'open(path, "w', "savefig(path")
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if any(b in line for b in bypasses) or ("open(" in line and '"w"' in line)
    ]
    assert found == []


# ------------------------------------------------------------ case 7: a copied folder


@pytest.mark.parametrize(
    "damage",
    [
        lambda f, t: ((t / "other").write_text("\x00\x01binary"),
                      (f / "resolved_config.yaml").unlink(),
                      (f / "resolved_config.yaml").symlink_to(t / "other")),
        lambda f, t: (f / "metrics.json").write_text("[1, 2]"),
        lambda f, t: (f / "metrics.json").write_text('{"num_blocks": "many"}'),
        lambda f, t: (f / "resolved_config.yaml").write_text(
            yaml.safe_dump({**resolved(), "max_model_len": {"a": 1}})),
        lambda f, t: (f / "resolved_config.yaml").write_text("- a list\n"),
        lambda f, t: (f / "resolved_config.yaml").write_text(yaml.safe_dump({"model": 1})),
    ],
    ids=["config-link-to-binary", "metrics-list", "num-blocks-text", "max-model-len-mapping",
         "config-list", "config-fields-missing"],
)  # fmt: skip
def test_deploy_of_a_damaged_folder_is_one_line(tmp_path, capsys, damage):
    folder = run_folder(tmp_path)
    damage(folder, tmp_path)
    assert deploy_main([str(folder)]) == 2
    one_line_error(capsys)
