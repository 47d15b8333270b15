"""Run folders nobody can corrupt: one writer per folder, resume checks what the finished
lines were made with, torn last lines are cut before appending (whole ones kept), and a
profile's YAML cannot expand without bound."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config.checks import ConfigError
from pipeline.config.expansion import check_expansion
from pipeline.job.run import run
from pipeline.profiles import measured_profile
from pipeline.run_folder import artefacts, reader
from pipeline.run_folder.folder_lock import LOCK_FILE, FolderBusy, FolderLock
from pipeline.run_folder.identity import check_identity, identity
from pipeline.run_folder.resume import appendable, load_previous
from tests.helpers import REPO, make_config, run_cli

HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "os.write(fd, str(os.getpid()).encode())\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("finished") / "run"
    run(make_config(["workload.num_requests=3"]), folder)
    return folder


@pytest.fixture
def folder(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


# ------------------------------------------------------------------------ one writer


def hold_in_this_process(folder: Path, pid: int) -> int:
    """Another holder, as far as flock can tell: a second open of the lock file."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.write(fd, f"{pid}\n".encode())
    return fd


def test_a_held_folder_is_refused_naming_the_holder(tmp_path):
    fd = hold_in_this_process(tmp_path, 4242)
    try:
        with pytest.raises(FolderBusy, match="in use by process 4242"), FolderLock(tmp_path):
            pass
    finally:
        os.close(fd)
    with FolderLock(tmp_path):  # released by its holder: free again
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_a_stale_lock_is_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text("999999999\n")  # a killed holder's pid, no lock held
    with FolderLock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_the_lock_is_reentrant_within_one_process(tmp_path):
    with FolderLock(tmp_path), FolderLock(tmp_path):  # the folder check, then the run
        pass
    fd = hold_in_this_process(tmp_path, 7)  # both released
    os.close(fd)


def test_a_run_into_a_held_folder_is_refused(tmp_path):
    fd = hold_in_this_process(tmp_path, 4242)
    try:
        with pytest.raises(FolderBusy):
            run(make_config(["workload.num_requests=1"]), tmp_path)
    finally:
        os.close(fd)
    assert not (tmp_path / "generations.jsonl").exists()


@pytest.mark.slow
def test_a_second_run_or_resume_of_a_held_folder_exits_2_before_writing(tmp_path, finished_run):
    target = tmp_path / "run"
    shutil.copytree(finished_run, target)
    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(target / LOCK_FILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        second = run_cli(tmp_path, "pipeline", f"hydra.run.dir={target}", "workload.num_requests=1")
        resume = run_cli(tmp_path, "pipeline", f"+resume={target}")
    finally:
        holder.kill()
        holder.wait()
    for result in (second, resume):
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"in use by process {holder.pid}" in lines[0], lines
    assert not (target / ".hydra").exists()  # refused before Hydra wrote its files
    after = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    assert after == {**before, LOCK_FILE: after[LOCK_FILE]}
    assert REPO  # the helper's PYTHONPATH is this checkout


# ------------------------------------------------------------------------ identity


def edit_config(folder: Path, key: str, value) -> None:
    path = folder / artefacts.RESOLVED_CONFIG
    cfg = yaml.safe_load(path.read_text())
    node = cfg
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    (folder / ".hydra").mkdir(exist_ok=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))  # resume reads this


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.hidden_size", 128),
        ("model.dtype", "bfloat16"),
        ("seed", 7),
        ("sampler._target_", "stages.sampling.sampler.RandomSampler"),
        ("tokenizer.add_bos", False),
    ],
)
def test_resume_refuses_a_config_the_lines_were_not_made_with(folder, key, value):
    edit_config(folder, key, value)
    with pytest.raises(ConfigError, match=rf"resume: {key} is .* finished lines were made"):
        load_previous(folder)


def test_resume_accepts_the_config_it_was_made_with(folder):
    edit_config(folder, "num_threads", 3)  # how fast, not which tokens
    assert len(load_previous(folder).kept) == 3


def test_resume_refuses_changed_weights(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"a" * 100)
    cfg = make_config([f"+model.path={weights}"])
    (tmp_path / "identity.json").write_text(json.dumps(identity(cfg)))
    check_identity(cfg, tmp_path, finished=1)  # the same files
    (weights / "model.safetensors").write_bytes(b"b" * 100)
    with pytest.raises(ConfigError, match="model.path:model.safetensors is not the file"):
        check_identity(cfg, tmp_path, finished=1)


# ------------------------------------------------------------------------ torn lines


def test_resume_keeps_a_whole_last_line_and_cuts_only_a_torn_one(folder, capsys):
    steps, generations = folder / artefacts.STEPS, folder / artefacts.GENERATIONS
    whole = steps.read_bytes()
    with open(steps, "ab") as f:
        f.write(b'{"step": 99, "mode": "dec')  # a full disk mid-write
    generations.write_bytes(generations.read_bytes().removesuffix(b"\n"))  # whole, unended
    before = {path: path.read_bytes() for path in (steps, generations)}
    previous = load_previous(folder)
    assert len(previous.kept) == 3  # the unended last line is a finished request
    assert len(previous.steps) == len(whole.splitlines())
    assert {path: path.read_bytes() for path in before} == before  # reading changes nothing
    appendable(steps)
    appendable(generations)
    assert steps.read_bytes() == whole
    assert generations.read_bytes() == before[generations] + b"\n"  # kept, its newline added
    out = capsys.readouterr().out
    assert "steps.jsonl ended mid-line; cut its last 25 bytes" in out
    assert "generations.jsonl ended mid-line" not in out


def test_a_folder_resume_refuses_is_left_as_it_was(folder):
    noise = np.random.default_rng(0).bytes(4096)  # seeded: the same bytes every run
    (folder / artefacts.GENERATIONS).write_bytes(noise)
    with pytest.raises(ConfigError, match="generations.jsonl"):
        load_previous(folder)
    assert (folder / artefacts.GENERATIONS).read_bytes() == noise


def test_a_resumed_folder_after_a_torn_tail_reads_back_whole(folder, tmp_path):
    lines = reader.read_generations(folder / artefacts.GENERATIONS)
    lines[1]["error"] = artefacts.INTERRUPTED  # served again on resume
    (folder / artefacts.GENERATIONS).write_text("".join(json.dumps(g) + "\n" for g in lines))
    with open(folder / artefacts.STEPS, "ab") as f:
        f.write(b'{"step": 1')
    run(make_config([f"+resume={folder}"]), tmp_path / "elsewhere")
    steps = reader.read_step_lines(folder / artefacts.STEPS)
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert json.loads((folder / artefacts.METRICS).read_text())["resumed_requests"] == 1


def test_readers_name_the_file_and_line(folder):
    path = folder / artefacts.STEPS
    with open(path, "a") as f:
        f.write('{"step": 1, "mode": "decode", "colour": 1}\n')
    count = len(path.read_text().splitlines())
    with pytest.raises(reader.RunFileError, match=rf"steps.jsonl:{count}: unknown field `"):
        reader.read_step_lines(path)


# ------------------------------------------------------------------------ bounded YAML


def profile_fields() -> dict:
    fields = yaml.safe_load((REPO / "conf" / "hardware" / "gaudi3.yaml").read_text())
    return {k: v for k, v in fields.items() if k != "defaults"}


def test_an_alias_bomb_in_a_profile_is_refused(tmp_path):
    """Ten levels of ten aliases: 10**10 values, counted on the node graph, never built."""
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    text = "\n".join(bomb) + "\n" + yaml.safe_dump({**profile_fields(), "name": "NAME"})
    path = tmp_path / "bomb.yaml"
    path.write_text(text.replace("NAME", "*i"))
    with pytest.raises(ValueError, match=f"hardware.path={path}: its aliases expand to more"):
        measured_profile(path)


def test_a_config_value_doubling_through_references_is_refused():
    doubling = ["+x0=abcdefgh"] + [f"+x{i}=${{x{i - 1}}}${{x{i - 1}}}" for i in range(1, 41)]
    cfg = make_config(doubling)
    with pytest.raises(ConfigError, match=r"x1[78] would expand to more than"):
        check_expansion(cfg)
    check_expansion(make_config(doubling[:10]))  # 4 KiB: fine


def test_metrics_are_written_whatever_one_field_holds(tmp_path):
    shared: list = ["x"] * 10
    for _ in range(9):
        shared = [shared] * 10  # 10**10 values by reference, as a YAML alias gives
    artefacts.write_metrics({"status": "ok", "hardware": shared, "duration_s": 1.5}, tmp_path)
    metrics = json.loads((tmp_path / artefacts.METRICS).read_text())
    assert metrics["status"] == "ok" and metrics["duration_s"] == 1.5
    assert metrics["hardware"].startswith("(not recorded")


# ------------------------------------------------------- damaged files: one line each


def with_hydra_files(folder: Path) -> Path:
    """The .hydra files a command-line run has beside the in-process run's."""
    (folder / ".hydra").mkdir(exist_ok=True)
    (folder / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    (folder / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    num: 0\n")
    return folder


def replace_first_line(path: Path, line: str) -> None:
    rest = path.read_text().splitlines(keepends=True)[1:]
    path.write_text(line + "\n" + "".join(rest))


def first_generation(folder: Path, **changes) -> str:
    line = json.loads((folder / artefacts.GENERATIONS).read_text().splitlines()[0])
    return json.dumps({**line, **changes})


# (name, damage, the file named, the words that must be in the line)
DAMAGE = [
    (
        "metrics list",
        lambda f: (f / "metrics.json").write_text("[]"),
        "metrics.json",
        "holds a list",
    ),
    (
        "metrics null",
        lambda f: (f / "metrics.json").write_text("null"),
        "metrics.json",
        "holds null",
    ),
    (
        "generation list",
        lambda f: replace_first_line(f / artefacts.GENERATIONS, "[1, 2]"),
        "generations.jsonl:1",
        "is a list",
    ),
    (
        "index abc",
        lambda f: replace_first_line(f / artefacts.GENERATIONS, first_generation(f, index="abc")),
        "generations.jsonl:1",
        "field `index` is 'abc'",
    ),
    (
        "output ids of text",
        lambda f: replace_first_line(
            f / artefacts.GENERATIONS, first_generation(f, output_ids="abc")
        ),
        "generations.jsonl:1",
        "field `output_ids`",
    ),
    (
        "unknown finish reason",
        lambda f: replace_first_line(
            f / artefacts.GENERATIONS, first_generation(f, finish_reason="done")
        ),
        "generations.jsonl:1",
        "field `finish_reason` is 'done', which must be one of stop, length, error or null",
    ),
    (
        "unknown step mode",
        lambda f: replace_first_line(
            f / artefacts.STEPS,
            json.dumps(
                {**json.loads((f / artefacts.STEPS).read_text().splitlines()[0]), "mode": "fill"}
            ),
        ),
        "steps.jsonl:1",
        "field `mode` is 'fill', which must be one of extend, decode, mixed",
    ),
    (
        "newer steps",
        lambda f: replace_first_line(
            f / artefacts.STEPS,
            json.dumps({**json.loads((f / artefacts.STEPS).read_text().splitlines()[0]), "x": 1}),
        ),
        "steps.jsonl:1",
        "unknown field `x`",
    ),
    (
        "broken overrides",
        lambda f: (f / ".hydra" / "overrides.yaml").write_text("{: [\n"),
        "overrides.yaml",
        "not valid YAML",
    ),
    (
        "overrides not a list",
        lambda f: (f / ".hydra" / "overrides.yaml").write_text("a: 1\n"),
        "overrides.yaml",
        "is not a list of overrides",
    ),
]
READS = {  # which command reads which file
    "review": ("metrics.json", "generations.jsonl", "overrides.yaml"),
    "summary": ("metrics.json", "overrides.yaml"),
    "resume": ("metrics.json", "generations.jsonl", "steps.jsonl"),
    "buckets": ("steps.jsonl", "metrics.json"),
}


def error_of(command: str, folder: Path) -> str | None:
    from pipeline import buckets, review, summary

    try:
        if command == "review":
            review.load_run(folder)
        elif command == "summary":
            job = summary.read_job(folder)
            return job.error if job.status == "unreadable" else None
        elif command == "resume":
            load_previous(folder)
        else:
            buckets.show(folder)
    except (review.ReviewError, ValueError) as err:
        return str(err)
    return None


@pytest.mark.parametrize(("name", "damage", "file", "words"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_run_file_is_one_line_naming_file_and_field(folder, name, damage, file, words):
    damage(with_hydra_files(folder))
    readers = [c for c, files in READS.items() if file.split(":")[0] in files]
    assert readers
    for command in readers:
        message = error_of(command, folder)
        assert message is not None, command
        assert f"{file}" in message and words in message and "\n" not in message, message


def test_review_refuses_repeated_ids(folder):
    from pipeline import review

    path = folder / artefacts.GENERATIONS
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["id"] = lines[0]["id"]
    path.write_text("".join(json.dumps(g) + "\n" for g in lines))
    with pytest.raises(review.ReviewError, match=rf"id '{lines[0]['id']}' is on 2 lines"):
        review.load_run(folder)


def test_result_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        artefacts.write_metrics({"status": "ok"}, tmp_path)
        artefacts.replace_lines(tmp_path / "g.jsonl", [b"{}\n"])
    finally:
        os.umask(old)
    assert (tmp_path / artefacts.METRICS).stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "g.jsonl").stat().st_mode & 0o777 == 0o644


def test_a_summary_it_cannot_write_is_one_line(folder, tmp_path):
    from pipeline import summary

    sweep = tmp_path / "sweep"
    shutil.copytree(with_hydra_files(folder), sweep / "0")
    (sweep / "summary.csv").mkdir()  # in the way, as a read-only folder would be
    with pytest.raises(summary.SummaryError, match="cannot write .*summary.csv"):
        summary.build_summary(sweep)


def test_buckets_plan_refuses_a_nan_weight_and_an_out_that_is_a_file(folder, tmp_path, capsys):
    from pipeline import buckets

    assert (
        buckets.main(["plan", str(folder), "--out", str(tmp_path / "o"), "--block-weight", "nan"])
        == 2
    )
    assert "--block-weight" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert buckets.main(["plan", str(folder), "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: cannot write") and err.count("\n") == 1


@pytest.mark.parametrize("name", ["report.md", "choice.json", "buckets"])
def test_buckets_plan_writes_nothing_through_a_link(folder, tmp_path, capsys, name):
    from pipeline import buckets

    out, target = tmp_path / "o", tmp_path / "victim"
    out.mkdir()
    target.mkdir() if name == "buckets" else target.write_text("precious\n")
    (out / name).symlink_to(target)
    assert buckets.main(["plan", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and err.count("\n") == 1
    assert os.listdir(target) == [] if target.is_dir() else target.read_text() == "precious\n"
