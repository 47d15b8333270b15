"""The peer benchmark's batching and the step profile's bookkeeping (no model is served)."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from benchmarks.peer import first_difference, sorted_batches
from benchmarks.profile_steps import PhaseProfile, _module_timers, kind_of, report


def test_sorted_batches_pad_each_batch_to_its_own_longest_prompt(torch) -> None:
    prompts = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10]]
    batches = list(sorted_batches(prompts, 2, pad_id=0))
    # Length order: [5] (1), [6, 7] (2), then [8, 9, 10] (3), [1, 2, 3, 4] (4).
    assert [group for _, _, group in batches] == [[1, 2], [3, 0]]
    ids, mask, _ = batches[0]
    assert ids.tolist() == [[0, 5], [6, 7]]
    assert mask.tolist() == [[0, 1], [1, 1]]
    ids, mask, _ = batches[1]
    assert ids.tolist() == [[0, 8, 9, 10], [1, 2, 3, 4]]
    assert mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]


def test_sorted_batches_cover_every_prompt_once(torch) -> None:
    prompts = [[i] * (1 + (7 * i) % 5) for i in range(11)]
    groups = [group for _, _, group in sorted_batches(prompts, 4, pad_id=0)]
    assert sorted(i for group in groups for i in group) == list(range(11))
    assert [len(g) for g in groups] == [4, 4, 3]


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("matmul", "matmul"),
        ("aten::addmm", "matmul"),
        ("softmax_", "attention"),
        ("gather", "gather/copy"),
        ("scatter_", "gather/copy"),
        ("multiply", "elementwise"),
        ("rsqrt", "elementwise"),
        ("something_new", "other"),
    ],
)
def test_kind_of(op: str, kind: str) -> None:
    assert kind_of(op) == kind


def test_module_timers_split_time_without_counting_twice(torch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 8))
    totals: dict[str, float] = defaultdict(float)
    _module_timers(model, totals)
    start = time.perf_counter()
    model(torch.ones(4, 64))
    wall = time.perf_counter() - start
    # Each module's own time, children's taken out: the kinds sum to the outer module's time.
    assert 0 < sum(totals.values()) <= wall
    assert totals["matmul"] > 0


def test_phase_profile_launch_is_wall_beyond_operators() -> None:
    profile = PhaseProfile()
    profile.add("decode", 1.0, {"matmul": 0.5, "softmax": 0.2, "add": 0.1}, calls=10)
    (row, _) = profile.rows("x")
    cells = [c.strip() for c in row.strip("|").split("|")]
    # side, phase, forwards, wall, roofline, wall / roofline, matmul, attention, gather,
    # elementwise, other, launch, ops; no roofline given, none shown
    assert cells[2:] == [
        "1", "1.00", "-", "-", "0.50", "0.20", "0.00", "0.10", "0.00", "0.20", "10"
    ]  # fmt: skip


def test_phase_profile_roofline_sums_over_forwards() -> None:
    profile = PhaseProfile()
    profile.add("decode", 1.0, {"matmul": 0.5}, calls=1, floor=0.25)
    profile.add("decode", 2.0, {"matmul": 1.5}, calls=1, floor=0.5)
    cells = [c.strip() for c in profile.rows("x")[0].strip("|").split("|")]
    assert cells[3:6] == ["3.00", "0.75", "4.00x"]  # 3 s of wall over 0.75 s of roofline


def test_phase_profile_keeps_times_already_filed_by_kind() -> None:
    profile = PhaseProfile()
    profile.add("decode", 1.0, {"elementwise": 0.3, "gather/copy": 0.1, "matmul": 0.4}, calls=0)
    assert dict(profile.ops["decode"]) == {"elementwise": 0.3, "gather/copy": 0.1, "matmul": 0.4}


def test_profile_report_without_the_peer_has_only_this_engines_rows() -> None:
    """--skip-peer: no peer figures, no peer rows, and no division by its zero time."""
    ours = PhaseProfile()
    ours.add("decode", 2.0, {"matmul": 1.0}, calls=4)
    ours.total_s, ours.tokens = 4.0, 100
    args = type("Args", (), {"model": "tiny", "requests": 1, "min_prompt": 1, "max_prompt": 2,
                             "new_tokens": 3, "threads": 2, "peer_batch": 16})()  # fmt: skip
    roofline = type("Roofline", (), {"rate": 1e11, "bandwidth": 4e10})()
    text = "\n".join(report(args, ours, PhaseProfile(), roofline))
    assert "this engine 4.00 s (25 tok/s)." in text
    assert "peer" not in text
