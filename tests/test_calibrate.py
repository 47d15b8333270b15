"""Calibration: timed warmup-shape steps give a profile the simulated device reads."""

from __future__ import annotations

from pipeline.calibrate import calibrate, error_summary, grid
from pipeline.compose import compose_config
from stages.simulator.hardware import read_profile, write_profile
from tests.conftest import LIMITS, serve

TINY_GRID = [*LIMITS, "max_tokens=64"]


def test_a_calibrated_profile_round_trips_into_a_simulated_run(tmp_path):
    profile, coefficients, report = calibrate(compose_config(TINY_GRID), max_shapes=12)
    assert len(report) >= 8 and all(v >= 0 for v in coefficients.values())
    assert error_summary(report)["median_error"] < 1.0  # a fit, however noisy the machine
    path = write_profile(tmp_path / "hardware.yaml", profile, coefficients)
    assert read_profile(path).coefficients == coefficients
    got, engine = serve(
        [*TINY_GRID, "executor=simulated", "hardware=measured", f"hardware.path={path}"]
    )
    assert all(r.finish_reason == "length" for r in got.values())
    assert engine.model.cost.coefficients == coefficients


def test_the_grid_spreads_over_every_phase():
    from pipeline.build import build_engine

    engine, _ = build_engine(compose_config(TINY_GRID))
    shapes = grid(engine, max_shapes=9)
    assert any(p and not d for p, d in shapes) and any(d and not p for p, d in shapes)
    assert any(p and d for p, d in shapes)  # the mixed phase of chunked prefill
