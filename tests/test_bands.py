"""A figure's band: the device's held-out error compounded with each feature's published
check, read from the files the checks write; a feature or precision no check covers takes
the widest band and says "unchecked"."""

from __future__ import annotations

import json

import pytest
import yaml
from omegaconf import OmegaConf

from benchmarks.published_moe import moe_feature
from pipeline.calibrate.check_results import CHECKS_DIR, FEATURES, CheckResult, read_results, record
from pipeline.plan.bands import Features, band_of, config_band, features_of
from stages.simulator.expert_parallel import ExpertParallel
from tests.helpers import make_config

H200 = {"name": "h200", "errors": {"offline": {"held_out_median": 0.07}}}


def result(feature: str, median: float) -> CheckResult:
    return CheckResult(feature, median, median, 10, ["h200"], "python -m x", "2026-01-01", "f")


CHECKS = {
    "attention_dp": result("attention_dp", 0.73),
    "disaggregation": result("disaggregation", 0.23),
}


def resolved(*overrides: str) -> dict:
    cfg = make_config(["executor=simulated", "hardware=h200", *overrides])
    return yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))


def test_device_and_feature_errors_compound_by_hand():
    dense = band_of(H200, Features((), "fp8"), CHECKS)
    assert dense.relative == pytest.approx(0.07) and not dense.unchecked
    both = band_of(H200, Features(("attention_dp", "disaggregation"), "fp8"), CHECKS)
    assert both.relative == pytest.approx(1.07 * 1.73 * 1.23 - 1)
    low, high = both.ends(10.0)
    assert (low, high) == pytest.approx((10.0 / (1.07 * 1.73 * 1.23), 10.0 * 1.07 * 1.73 * 1.23))
    assert "attention_dp check 73%" in both.describe()


def test_unchecked_takes_the_widest_and_says_so():
    # no check of draft speculation; bf16 ("none") is not what h200's published rows used
    band = band_of(H200, Features(("speculative_draft",), "none"), CHECKS)
    assert band.unchecked == ("precision quantization=none", "speculative_draft")
    assert band.relative == pytest.approx(1.07 * 1.73 * 1.73 - 1)
    assert "unchecked" in band.describe()


def test_features_of_a_config():
    moe = ["model=spec/qwen3_30b_a3b", "quantization=fp8"]
    assert features_of(resolved(*moe)).names == ()
    assert features_of(resolved(*moe, "tp=1", "dp=2", "ep=2")).names == ("attention_dp",)
    assert features_of(resolved(*moe, "tp=2", "ep=2")).names == ("expert_parallel",)
    pools = features_of(resolved(*moe, "disagg.prefill=1", "disagg.decode=1"))
    assert pools.names == ("disaggregation",) and pools.quantization == "fp8"
    spec = features_of(resolved(*moe, "speculative.method=ngram", "speculative.tokens=2"))
    assert spec.names == ("speculative_ngram",)


def test_a_dp_row_is_wider_than_the_dp1_row_of_its_device_with_the_recorded_checks():
    if "attention_dp" not in read_results():
        pytest.skip("no attention_dp result recorded")
    moe = ["model=spec/qwen3_30b_a3b", "quantization=fp8"]
    dense, dp = config_band(resolved(*moe)), config_band(resolved(*moe, "tp=1", "dp=2", "ep=2"))
    recorded = read_results()["attention_dp"].median_error
    assert 1 + dp.relative == pytest.approx((1 + dense.relative) * (1 + recorded))


def test_a_check_records_its_errors_and_the_bands_read_them(tmp_path):
    path = record("disaggregation", [0.1, -0.3, 0.2], ["h100", "h100"], "a.csv", "python -m c",
                  folder=tmp_path)  # fmt: skip
    data = json.loads(path.read_text())
    assert (data["median_error"], data["worst_error"], data["rows"]) == (0.2, 0.3, 3)
    assert read_results(tmp_path)["disaggregation"].devices == ["h100"]
    with pytest.raises(ValueError, match="unknown feature"):
        record("moe", [0.1], ["h100"], "a.csv", "c", folder=tmp_path)


def test_the_shipped_results_come_from_the_checks():
    for feature, found in read_results(CHECKS_DIR).items():
        assert feature in FEATURES and found.command.startswith("python -m benchmarks.published")
        assert 0 <= found.median_error <= found.worst_error


def test_the_moe_check_names_the_feature_its_reading_checks():
    assert moe_feature([ExpertParallel(8, 8)]) == "attention_dp"
    assert moe_feature([ExpertParallel(8, 1)]) == "expert_parallel"
    assert moe_feature([ExpertParallel(1, 1)]) == ""
