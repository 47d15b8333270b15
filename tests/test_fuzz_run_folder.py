"""Fuzzing the files the tool reads back: a run folder's files (whatever a line, a config or
metrics.json holds: random JSON values, random bytes, a cut) give review, summary, resume and
buckets either a result or one line naming the file, never a traceback; a profile YAML gives
a profile whose every field is checked, or one line naming the file."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import buckets, review, summary
from pipeline.job.run import run
from pipeline.profiles import measured_profile
from pipeline.run_folder import artefacts
from pipeline.run_folder.resume import load_previous
from stages.simulator.hardware import _RANGES, HardwareProfile
from tests.helpers import REPO, make_config

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 1e308, -0.0, 10**20]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)

FILES = [
    "metrics.json",
    "generations.jsonl",
    "steps.jsonl",
    "resolved_config.yaml",
    "identity.json",
    ".hydra/overrides.yaml",
    ".hydra/hydra.yaml",
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz") / "run"
    run(make_config(["workload.num_requests=2", "workload.max_new_tokens=4"]), folder)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("- workload.num_requests=2\n")
    (folder / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    num: 0\n")
    return folder


def mutate(text: bytes, how: str, value, raw: bytes, cut: float) -> bytes:
    """One damage: a line (or the whole file) replaced by a JSON value or random bytes, a
    field of a line given a random value, or the file cut short."""
    lines = text.splitlines(keepends=True) or [b""]
    line = int(cut * len(lines)) % len(lines)
    encoded = json.dumps(value, allow_nan=True).encode()
    if how == "whole":
        return encoded
    if how == "line":
        lines[line] = encoded + b"\n"
    elif how == "bytes":
        lines[line] = raw + b"\n"
    elif how == "field":
        try:
            obj = json.loads(lines[line])
        except ValueError:
            return text
        if isinstance(obj, dict) and obj:
            keys = sorted(obj)
            obj[keys[int(cut * len(keys)) % len(keys)]] = value
        lines[line] = json.dumps(obj, allow_nan=True).encode() + b"\n"
    else:  # a cut
        return text[: int(cut * len(text))]
    return b"".join(lines)


def readers(folder: Path):
    yield "review", lambda: review.load_run(folder)
    yield "summary", lambda: summary.read_job(folder)
    yield "resume", lambda: load_previous(folder)
    yield "buckets", lambda: buckets.show(folder)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.sampled_from(FILES),
    st.sampled_from(["whole", "line", "bytes", "field", "cut"]),
    values,
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b" ")),
    st.floats(min_value=0, max_value=0.999),
)
def test_a_damaged_run_folder_is_read_or_refused_in_one_line(finished, name, how, value, raw, cut):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        shutil.copytree(finished, folder)
        path = folder / name
        path.write_bytes(mutate(path.read_bytes(), how, value, raw, cut))
        for command, read in readers(folder):
            try:
                result = read()
            except (review.ReviewError, ValueError) as err:  # ConfigError, SourceError too
                message = str(err)
                assert message and "\n" not in message, (command, message)
                continue
            if command == "summary" and result.status == "unreadable":
                assert "\n" not in result.error
            if command == "resume":
                assert all(isinstance(i, int) and i >= 0 for i in result.kept)
                assert all(math.isfinite(s.duration_s) for s in result.steps)


# ---------------------------------------------------------------------------- profiles

PROFILE = {
    k: v
    for k, v in yaml.safe_load((REPO / "conf" / "hardware" / "gaudi3.yaml").read_text()).items()
    if k != "defaults"
}
FIELDS = [*PROFILE, "coefficients"]


@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=3),
    st.lists(st.sampled_from(FIELDS), max_size=2),
    st.sampled_from(["yaml", "bytes", "alias"]),
    st.binary(max_size=60),
)
def test_a_profile_is_checked_or_refused_in_one_line(changes, dropped, how, raw):
    fields = {k: v for k, v in {**PROFILE, **changes}.items() if k not in dropped}
    text = yaml.safe_dump(fields, allow_unicode=True).encode()
    if how == "bytes":
        text = raw
    elif how == "alias":  # one field shares a list many times over
        text = b"x: &x [1, 2, 3, 4, 5, 6, 7, 8]\ny: &y [*x, *x, *x, *x, *x, *x, *x, *x]\n" + text
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_bytes(text)
        try:
            profile = measured_profile(path)
        except ValueError as err:
            message = str(err)
            assert message.startswith(f"hardware.path={path}") and "\n" not in message, message
            return
    assert isinstance(profile, HardwareProfile) and isinstance(profile.name, str)
    assert isinstance(profile.pads_to_buckets, bool)
    for key, (low, high, _, _) in _RANGES.items():
        value = getattr(profile, key)
        assert isinstance(value, float) and math.isfinite(value) and low <= value <= high
    assert all(math.isfinite(v) and v >= 0 for v in profile.coefficients.values())


def test_the_profile_fuzz_reaches_a_valid_profile():
    """The property above is not vacuous: the unchanged fields make a profile."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(yaml.safe_dump(PROFILE))
        assert measured_profile(path).name == "gaudi3"
    assert artefacts.METRICS in FILES
