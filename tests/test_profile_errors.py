"""A fitted profile's errors by method (fit and split-half held out), by hand, and the
profile file that carries them read back with its release."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import yaml
from hydra.utils import instantiate

from pipeline.calibrate.profile_yaml import profile_fields
from pipeline.calibrate.residuals import Half, profile_errors, sources
from pipeline.plan.bands import profile_band
from tests.helpers import make_config


class Row:
    """A recorded row whose error on each profile is given."""

    def __init__(self, hardware: str, mode: str, model: str, errors: dict[str, float]) -> None:
        self.row = SimpleNamespace(hardware=hardware, mode=mode, model_preset=model, source="S")
        self.errors = errors

    def error(self, profile) -> float:
        return self.errors[profile]


def test_errors_by_method_fit_and_held_out_by_hand():
    # profiles stand in as names: "all" is the full fit, "a"/"b" the two halves' fits
    rows = [
        Row("h100", "offline", "8b", {"all": 0.02, "a": 0.01, "b": -0.10}),
        Row("h100", "offline", "8b", {"all": -0.04, "a": 0.02, "b": 0.20}),
        Row("h100", "offline", "70b", {"all": 0.06, "a": -0.08, "b": 0.01}),
        Row("h100", "static", "70b", {"all": 0.10, "a": 0.30, "b": 0.02}),
        Row("h200", "offline", "70b", {"all": 0.5, "a": 0.5, "b": 0.5}),
    ]
    fitted = {"h100": "all"}
    halves = [Half("8b", rows[2:], {"h100": "a"}), Half("70b", rows[:2], {"h100": "b"})]
    errors = profile_errors("h100", fitted, rows, halves)
    # offline: fit |.02|, |.04|, |.06| -> median .04, worst .06; held out: half "8b" sees
    # row 2 (.08), half "70b" sees rows 0, 1 (.10, .20: median .15) -> worse median .15
    assert errors["offline"] == {"fit_median": 0.04, "fit_worst": 0.06,
                                 "held_out_median": 0.15, "held_out_worst": 0.2}  # fmt: skip
    # static: one row, held out only by the "8b" half (.30)
    assert errors["static"] == {"fit_median": 0.1, "fit_worst": 0.1,
                                "held_out_median": 0.3, "held_out_worst": 0.3}  # fmt: skip
    assert sources("h100", rows) == "S"


def test_the_profile_file_carries_its_errors_and_release():
    profile = instantiate(make_config(["executor=simulated", "hardware=gaudi3"]).hardware)
    profile = dataclasses.replace(
        profile, errors={"static": {"held_out_median": 0.2}}, software="SW 1.21, 'quoted'"
    )
    data = yaml.safe_load("\n".join(profile_fields(profile)))
    assert data["errors"] == {"static": {"held_out_median": 0.2}}
    assert data["software"] == "SW 1.21, 'quoted'"
    band = profile_band(data)
    assert (band.relative, band.method) == (pytest.approx(0.2), "static")


@pytest.mark.parametrize(
    "errors, message",
    [
        ({"static": 0.2}, "hardware.errors.static must map"),
        ({"static": {"held_out_median": "x"}}, "hardware.errors.static.held_out_median"),
        ({"static": {"held_out_median": 40.0}}, "must be a fraction in"),
        ("0.2", "must map methods"),
    ],
)
def test_a_profile_with_bad_errors_is_refused_with_the_field_named(errors, message):
    profile = instantiate(make_config(["executor=simulated", "hardware=gaudi3"]).hardware)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(profile, errors=errors)


def test_an_older_profile_file_without_release_or_errors_still_reads(tmp_path):
    from stages.simulator.hardware import read_profile

    profile = instantiate(make_config(["executor=simulated", "hardware=h100"]).hardware)
    data = {k: v for k, v in dataclasses.asdict(profile).items() if k not in ("software", "errors")}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    read = read_profile(tmp_path / "old.yaml")
    assert (read.software, read.errors) == ("", {})
