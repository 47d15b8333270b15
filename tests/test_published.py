"""Published rows simulated in their method, re-timed for other hardware, and fitted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.calibrate.fit import fit, pattern_search
from pipeline.calibrate.published import DATA, PublishedRow, offline_limits, read_rows, simulate_row
from pipeline.calibrate.recorded import Recorded, record
from stages.simulator.step_work import StepAmounts

# The figures a fit changes, fixed here so that a test does not follow the shipped profiles.
TEST_FIGURES = {
    "gemm_efficiency": 0.7,
    "attention_efficiency": 0.6,
    "memory_efficiency": 0.8,
    "interconnect_efficiency": 0.75,
    "step_overhead_s": 0.002,
    "gemm_fill_s": 5e-6,
    "allreduce_latency_s": 1.5e-5,
}


def small_row(mode: str = "offline", **changes) -> PublishedRow:
    row = PublishedRow(
        source="test",
        where="",
        hardware="h100",
        model_preset="llama31_8b",
        tp=1,
        quantization="fp8",
        kv_cache_dtype="fp8",
        mode=mode,
        input_tokens=96,
        output_tokens=24,
        batch_size=8 if mode == "static" else 0,
        num_requests=8 if mode == "static" else 20,
        value=1000.0,
    )
    return dataclasses.replace(row, **changes)


def test_the_shipped_file_reads_and_names_its_sources():
    rows = read_rows(DATA)
    assert len(rows) == 56
    assert {r.hardware for r in rows} == {"h100", "h200", "gaudi2", "gaudi3"}
    assert all(r.source and r.where for r in rows)
    # The Gaudi rows at a parallel degree no profile was fitted to: the same file's, unseen.
    unseen = read_rows(DATA.parent / "published-gaudi-tp8.csv")
    assert {(r.hardware, r.tp) for r in unseen} == {("gaudi2", 8), ("gaudi3", 8)}
    fitted = {(r.hardware, r.model_preset, r.tp, r.input_tokens, r.output_tokens) for r in rows}
    assert not fitted & {
        (r.hardware, r.model_preset, r.tp, r.input_tokens, r.output_tokens) for r in unseen
    }
    assert {r.source for r in unseen} <= {r.source for r in rows}


def test_a_bad_row_is_one_line_naming_it(tmp_path):
    text = DATA.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([text[0], text[1].replace(",offline,", ",streaming,")]) + "\n")
    with pytest.raises(ValueError, match="line 2: mode='streaming'") as err:
        read_rows(bad)
    assert "\n" not in str(err.value)


def test_offline_limits_by_hand():
    # 1,000,000 KV tokens at 128 + 128: 3906 requests; 256-steps round them to 4096, and
    # 3906.25 x (1 + 1) = 7812.5 tokens rounds up to 512 x 16 = 8192.
    assert offline_limits(small_row(input_tokens=128, output_tokens=128), 1_000_000) == (4096, 8192)
    # Few requests: at least 64 of them and 2048 tokens; the caps hold for many.
    assert offline_limits(small_row(input_tokens=20000, output_tokens=2000), 500_000) == (64, 2048)
    assert offline_limits(small_row(input_tokens=500, output_tokens=20), 10**9) == (4096, 32768)


@pytest.mark.parametrize("mode", ["offline", "static"])
def test_retimed_steps_equal_a_fresh_simulation_on_other_hardware(mode):
    row = small_row(mode, hardware="gaudi2") if mode == "static" else small_row()
    run = simulate_row(row, record=True)
    steps = StepAmounts.stack([a for a, _ in run.steps])
    recorded = Recorded(row, run.cost, steps, sum(n for _, n in run.steps), run.output_tokens)
    assert recorded.predicted(run.cost.hardware) == pytest.approx(run.predicted, rel=1e-9)
    assert run.num_steps == len(run.steps) > 2
    slower = dataclasses.replace(
        run.cost.hardware, memory_efficiency=0.3, step_overhead_s=0.01, gemm_fill_s=2e-5
    )
    fresh = simulate_row(row, slower)
    assert fresh.predicted < run.predicted
    assert recorded.predicted(slower) == pytest.approx(fresh.predicted, rel=1e-9)


def test_pattern_search_finds_a_bounded_minimum():
    target = np.array([0.3, -1.2])
    found = pattern_search(
        lambda x: float(np.sum((x - target) ** 2)),
        np.zeros(2),
        np.array([-5.0, -1.0]),
        np.array([5.0, 5.0]),
    )
    assert found == pytest.approx([0.3, -1.0], abs=0.01)  # the second at its bound


@pytest.mark.slow
def test_a_fit_recovers_figures_that_made_the_published_values():
    rows = [small_row(input_tokens=n, output_tokens=m) for n, m in ((96, 24), (512, 16), (32, 96))]
    rows.append(small_row(model_preset="llama31_70b", tp=2, input_tokens=256, output_tokens=32))
    shipped = record(rows[:1], None)[0].cost.hardware
    true = dataclasses.replace(
        shipped, **{**TEST_FIGURES, "gemm_efficiency": 0.5, "memory_efficiency": 0.6}
    )
    true = dataclasses.replace(true, step_overhead_s=0.004)
    made = [dataclasses.replace(r, value=simulate_row(r, true).predicted) for r in rows]
    recorded = record(made, true)
    start = dataclasses.replace(true, gemm_efficiency=0.8, step_overhead_s=0.001)
    fitted = fit(recorded, {"h100": start})["h100"]
    before = [abs(r.error(start)) for r in recorded]
    errors = [abs(r.error(fitted)) for r in recorded]
    # The weak pull towards the start keeps it from exact; far closer than the start.
    assert max(errors) < 0.03 < max(before) / 4


def test_the_commands_refuse_a_missing_file_in_one_line(capsys, tmp_path):
    from benchmarks.published import main as published
    from pipeline.calibrate.fit import main as calibrate

    missing = tmp_path / "none.csv"
    assert published(["--file", str(missing)]) == 2
    assert calibrate(["--published", str(missing), "hardware=h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("Error: ") for line in err)


@pytest.mark.slow
def test_calibrate_writes_a_profile_that_reads_back_and_names_its_rows(tmp_path):
    from pipeline.calibrate.fit import main as calibrate
    from pipeline.profiles import measured_profile

    rows = [small_row(), small_row(input_tokens=400, output_tokens=16, value=300.0)]
    header = DATA.read_text().splitlines()[0]
    lines = [header]
    for r in rows:
        lines.append(
            f"test,here,{r.hardware},{r.model_preset},{r.tp},{r.quantization},"
            f"{r.kv_cache_dtype},{r.mode},{r.input_tokens},{r.output_tokens},,"
            f"{r.num_requests},output_throughput,{r.value},tok/s,a test"
        )
    data = tmp_path / "rows.csv"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "fitted.yaml"
    assert calibrate(["--published", str(data), "hardware=h100", "--out", str(out)]) == 0
    text = out.read_text()
    assert "8b tp1 96/24: 1000 tok/s" in text and "8b tp1 400/16: 300 tok/s" in text
    profile = measured_profile(out)
    assert profile.name == "h100" and profile.fp8_tflops == 1979


def test_a_cached_recording_is_re_timed_without_simulating_again(tmp_path, monkeypatch):
    import pipeline.calibrate.recorded as recorded_rows

    row = small_row(num_requests=6)
    first = record([row], None, cache=tmp_path)[0]
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def no_simulation(*args, **kwargs):
        raise AssertionError("the cached row was simulated again")

    monkeypatch.setattr(recorded_rows, "recorded_run", no_simulation)
    again = record([dataclasses.replace(row, value=5.0)], None, cache=tmp_path)[0]
    slower = dataclasses.replace(first.cost.hardware, memory_efficiency=0.3)
    assert again.predicted(slower) == pytest.approx(first.predicted(slower), rel=1e-12)
    assert again.row.value == 5.0  # the published figure is the new row's
    # Another row (or config) is another recording.
    with pytest.raises(AssertionError, match="simulated again"):
        record([dataclasses.replace(row, output_tokens=23)], None, cache=tmp_path)


def test_devices_fitted_together_share_all_but_their_memory():
    from pipeline.calibrate.fit import parameters

    rows = [small_row(hardware=h, tp=t) for h in ("h100", "h200") for t in (1, 2)]
    recorded = [
        Recorded(r, None, StepAmounts.stack([]), 0, 1)  # type: ignore[arg-type]
        for r in rows
    ]
    chosen = parameters(recorded, ["h100", "h200"])
    own = {(p.key, p.device) for p in chosen if p.device}
    assert own == {("memory_efficiency", "h100"), ("memory_efficiency", "h200")}
    shared = {p.key for p in chosen if p.device is None}
    assert "gemm_efficiency" in shared and "allreduce_latency_s" in shared
    # One device: each figure once; tp=1 rows alone tell nothing of the links.
    alone = parameters(recorded[:1], ["h100"])
    assert {p.device for p in alone} == {None}
    assert "allreduce_latency_s" not in {p.key for p in alone}


@pytest.mark.slow
def test_a_joint_fit_recovers_a_shared_compute_and_each_devices_memory():
    rows = [
        small_row(hardware=h, input_tokens=n, output_tokens=m)
        for h in ("h100", "h200")
        for n, m in ((96, 24), (512, 16), (32, 96))
    ]
    recorded = record(rows, None)
    starts = {
        r.row.hardware: dataclasses.replace(r.cost.hardware, **TEST_FIGURES) for r in recorded
    }
    true = {
        name: dataclasses.replace(
            hw, gemm_efficiency=0.5, step_overhead_s=0.004, memory_efficiency=memory
        )
        for (name, hw), memory in zip(starts.items(), (0.6, 0.85), strict=True)
    }
    for r in recorded:  # the figures the true profiles give, as if published
        r.row = dataclasses.replace(r.row, value=r.predicted(true[r.row.hardware]))
    fitted = fit(recorded, starts)
    assert fitted["h100"].gemm_efficiency == fitted["h200"].gemm_efficiency
    errors = [abs(r.error(fitted[r.row.hardware])) for r in recorded]
    before = [abs(r.error(starts[r.row.hardware])) for r in recorded]
    assert max(errors) < 0.03 < max(before) / 4


def test_a_fit_starts_from_the_start_files_figures_not_the_fitted_profile(tmp_path):
    from pipeline.calibrate.fit import START, starting_profiles

    shipped = starting_profiles(["gaudi2"], [], START)
    start = tmp_path / "start.yaml"
    start.write_text("gaudi2:\n  gemm_efficiency: 0.31\n  step_overhead_s: 0.007\n")
    chosen = starting_profiles(["gaudi2", "gaudi3"], [], start)["gaudi2"]
    assert (chosen.gemm_efficiency, chosen.step_overhead_s) == (0.31, 0.007)
    assert chosen.bf16_tflops == shipped["gaudi2"].bf16_tflops  # the spec sheet's, kept
    start.write_text("gaudi2:\n  bf16_tflops: 1000\n")
    with pytest.raises(ValueError, match="bf16_tflops are not fitted"):
        starting_profiles(["gaudi2"], [], start)
