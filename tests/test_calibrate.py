"""Calibration: the steps of real runs (and timed warmup shapes) give a profile the simulated
device reads; bad run folders are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pipeline.calibrate import calibrate, error_summary, grid, run_samples
from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.job.run import run
from pipeline.profiles import measured_profile
from stages.forward.forward_meta import bucket_dims, bucket_label
from stages.simulator.hardware import write_profile
from tests.helpers import LIMITS, ONE_THREAD, REPO, serve

TINY_GRID = [*LIMITS, "max_tokens=64"]
SERVED = [*TINY_GRID, "workload.num_requests=12", "workload.max_new_tokens=12"]
REAL = [*SERVED, ONE_THREAD]  # served for real; SERVED alone for any executor


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")  # a run folder is made before it is served
    run(compose_config(REAL), folder)
    return folder


def test_bucket_labels_read_back_as_the_dims_they_print():
    rng = np.random.default_rng(0)
    for _ in range(200):
        prefill = tuple(int(x) for x in rng.integers(1, 5000, 3)) if rng.random() < 0.7 else None
        decode = tuple(int(x) for x in rng.integers(1, 5000, 2)) if rng.random() < 0.7 else None
        if prefill or decode:
            assert bucket_dims(bucket_label(prefill, decode)) == (prefill, decode)
    for bad in ("prefill 2x3", "decode 4xa", "mixed 1x2", "decode 1x2 + decode 1x2", ""):
        with pytest.raises(ValueError, match="is not 'prefill AxBxC"):
            bucket_dims(bad)


def test_a_run_folder_gives_one_sample_per_step_with_its_block_size(served_run):
    lines = (served_run / "steps.jsonl").read_text().splitlines()
    samples = run_samples(served_run, pads_to_buckets=False)
    assert len(samples) == len(lines) > 3
    for (shape, seconds), line in zip(samples, lines, strict=True):
        step = json.loads(line)
        assert shape.block_size == 16 and seconds == step["duration_s"]
        assert bucket_label(shape.prefill, shape.decode) == step["bucket"]
        assert shape.chunk_lens == tuple(c["end"] - c["start"] for c in step["prefill"])
        assert shape.context_lens == tuple(c["start"] for c in step["prefill"])
        assert len(shape.decode_lens) == len(step["decode"])


def test_each_decode_row_is_recorded_with_the_tokens_it_attends_to(served_run):
    """Unpreempted, a request's j-th decode step attends to its prompt and j tokens: the
    first token came from its prefill, and the new one is written before it is read."""
    prompts = {
        g["id"]: g["prompt_tokens"]
        for g in map(json.loads, (served_run / "generations.jsonl").read_text().splitlines())
    }
    steps = [json.loads(line) for line in (served_run / "steps.jsonl").read_text().splitlines()]
    assert not any(s["preempted"] for s in steps), "the check assumes no preemption"
    decodes = dict.fromkeys(prompts, 0)
    for step in steps:
        assert len(step["decode_lens"]) == len(step["decode"])
        for rid, length in zip(step["decode"], step["decode_lens"], strict=True):
            decodes[rid] += 1
            assert length == prompts[rid] + decodes[rid]
    assert sum(decodes.values()) > 10


def test_a_calibrated_profile_round_trips_into_a_simulated_run(served_run, tmp_path):
    profile, coefficients, report = calibrate(compose_config(REAL), runs=[served_run])
    assert len(report) == len(run_samples(served_run, False)) and all(
        v >= 0 for v in coefficients.values()
    )
    assert error_summary(report)["median_error"] < 1.0  # a fit, however noisy the machine
    path = write_profile(tmp_path / "hardware.yaml", profile, coefficients)
    assert measured_profile(path).coefficients == coefficients
    got, engine = serve(
        [*SERVED, "executor=simulated", "hardware=measured", f"hardware.path={path}"]
    )
    assert all(r.finish_reason == "length" for r in got.values())
    assert engine.model.cost.coefficients == coefficients


def test_warmup_shapes_add_to_the_served_steps_of_a_padding_forward(served_run):
    # Dense reference attention computes the padded buckets: its warmup shapes are real work.
    padded = compose_config([*REAL, "attention=reference"])
    _, _, report = calibrate(padded, grid_shapes=9, runs=[served_run])
    assert len(report) == len(run_samples(served_run, True)) + 9
    # The CPU ops pack real tokens: a padding-only warmup shape would time nothing.
    with pytest.raises(ConfigError, match="calibrate.grid_shapes=0"):
        calibrate(compose_config(REAL), grid_shapes=9, runs=[served_run])


def test_bad_run_folders_are_one_line_errors(served_run, tmp_path):
    with pytest.raises(ConfigError, match="is not a run folder"):
        run_samples(tmp_path, False)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "resolved_config.yaml").write_text((served_run / "resolved_config.yaml").read_text())
    lines = (served_run / "steps.jsonl").read_text().splitlines()
    (broken / "steps.jsonl").write_text("\n".join([lines[0], '{"bucket": "prefill 1x"}']) + "\n")
    with pytest.raises(ConfigError, match="steps.jsonl:2: no `decode` field"):
        run_samples(broken, False)
    old = next(step for step in map(json.loads, lines) if step["decode"])
    del old["decode_lens"]
    (broken / "steps.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(ConfigError, match="no decode_lens .* serve it again"):
        run_samples(broken, False)
    assert len(run_samples(broken, True)) == 1  # a padding device reads the buckets alone
    simulated = tmp_path / "simulated"
    simulated.mkdir()
    run(compose_config([*SERVED, "executor=simulated", "model=spec/ernie45_0p3b"]), simulated)
    with pytest.raises(ConfigError, match="is a simulated run; give real runs"):
        run_samples(simulated, False)
    with pytest.raises(ConfigError, match="no steps to fit"):
        calibrate(compose_config(REAL))


def test_the_grid_spreads_over_every_phase():
    from pipeline.executors import build_engine

    engine, _ = build_engine(compose_config([*TINY_GRID, ONE_THREAD]))
    shapes = grid(engine, max_shapes=9)
    assert any(p and not d for p, d in shapes) and any(d and not p for p, d in shapes)
    assert any(p and d for p, d in shapes)  # the mixed phase of chunked prefill


@pytest.mark.slow
def test_the_command_serves_then_writes_a_profile(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.calibrate", *REAL, f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "served" / "steps.jsonl").is_file()
    fitted = json.loads((tmp_path / "calibration.json").read_text())
    assert fitted["samples"] == len(run_samples(tmp_path / "served", False))
    assert measured_profile(tmp_path / "hardware.yaml").coefficients == fitted["coefficients"]


def test_steps_record_their_buckets_as_numbers():
    """Calibration reads a step's buckets from `padded`, never from the printed label; a
    line written before `padded` existed still reads by its label."""
    from dataclasses import asdict

    from pipeline.calibrate import step_buckets

    steps = []
    serve(["max_tokens=48"], steps=steps)
    parts = [set(s.padded) for s in steps]
    assert {"prefill"} in parts and {"decode"} in parts  # steps of each part alone
    for record in steps:
        line = asdict(record)
        assert step_buckets(line) == bucket_dims(record.bucket)
        del line["padded"]
        assert step_buckets(line) == bucket_dims(record.bucket)
