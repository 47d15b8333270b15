"""Bucket planning: explicit sizes, the needed dims in steps.jsonl, the warmup budget, the
planner's optimality against brute force, and coverage of the planned workload."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from pipeline.buckets import main as buckets_main
from pipeline.buckets import plan_source, run_limits
from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.job.run import build_engine
from stages.forward.bucket_planner import (
    Workload,
    breakpoint_table,
    evaluate,
    pad_to,
    plan_buckets,
    plan_prefill_pair,
    tail_sizes,
)
from stages.forward.buckets import (
    Axis,
    Buckets,
    StepRule,
    decode_count,
    decode_shapes,
    is_warmed,
    mixed_pairs,
    prefill_count,
    prefill_shapes,
    warmup_counts,
)
from stages.forward.engine_grids import step_graphs
from stages.forward.forward_meta import bucket_dims
from stages.scheduling.kv_cache import blocks_for
from tests.helpers import LIMITS, ONE_THREAD, SMALL, make_config, run_cli, serve

# -- helpers ---------------------------------------------------------------------------------


def subsets_with_max(values: list[int]):
    """Every set of the distinct values that holds the largest (what covers them all)."""
    distinct = sorted(set(values))
    rest, top = distinct[:-1], distinct[-1]
    for k in range(len(rest) + 1):
        for combo in itertools.combinations(rest, k):
            yield [*combo, top]


def padded_sum(values, weights, sizes) -> float:
    """Independent of the planner: each value padded to the first size at least it."""
    return float(
        sum(w * min(s for s in sizes if s >= v) for v, w in zip(values, weights, strict=True))
    )


def write_run(folder: Path, overrides: list[str]) -> tuple[Path, list[dict], object]:
    """Serves in-process and writes the files the planner reads (resolved config with the
    pool size the run had, steps.jsonl, metrics.json)."""
    cfg = make_config(overrides)
    steps: list = []
    got, engine = serve(overrides, steps=steps)
    folder.mkdir(parents=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["num_blocks"] = engine.scheduler.kv_cache.num_blocks
    (folder / "resolved_config.yaml").write_text(OmegaConf.to_yaml(resolved))
    records = [dataclasses.asdict(s) for s in steps]
    (folder / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "metrics.json").write_text(
        json.dumps({"bucket_misses": engine.metadata.bucket_misses})
    )
    return folder, records, (got, engine)


# -- explicit sizes and composition -----------------------------------------------------------


def test_sizes_win_over_min_step_max_and_keep_the_fallback_step():
    axis = Axis(min=1, step=4, max=32, explicit=(2, 5, 9))
    assert axis.sizes("linear") == axis.sizes("exponential") == [2, 5, 9]
    buckets = Buckets("linear", {"decode_batch": axis, "decode_blocks": Axis(1, 1, 4)})
    assert buckets.shape("decode", batch=6, blocks=2) == (9, 2)
    assert buckets.shape("decode", batch=10, blocks=2) == (12, 2)  # miss: step 4 rounds it
    assert buckets.misses == 1


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("metadata.decode_batch.sizes=[4,2]", "metadata.decode_batch.sizes=[4, 2]"),
        ("metadata.prefill_batch.sizes=[0,2]", "increasing positive"),
        ("metadata.prefill_seq.sizes=[16,40]", "multiple of block_size=16"),
    ],
)
def test_bad_sizes_are_one_line_config_errors(override, words):
    with pytest.raises(ConfigError) as err:
        build_engine(make_config([override]))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_planned_file_composes_into_exactly_its_sizes(tmp_path):
    folder, _, _ = write_run(tmp_path / "run", [])
    plan, _ = plan_source(folder, 40, tmp_path / "plan", "mine", block_weight=0.005)
    text = (tmp_path / "plan" / "buckets" / "mine.yaml").read_text()
    assert text.startswith("# @package _global_")
    cfg = compose_config(
        [*SMALL, f"hydra.searchpath=[file://{tmp_path / 'plan'}]", "+buckets=mine"]
    )
    engine, _ = build_engine(cfg)
    got = {name: values.tolist() for name, values in engine.metadata.buckets.sizes.items()}
    assert got == plan.sizes
    assert sum(engine.metadata.warmup_counts(mixed=True).values()) <= 40


# -- the needed dims in steps.jsonl -----------------------------------------------------------


def test_needed_dims_are_the_unpadded_step_and_pad_to_its_bucket():
    steps: list = []
    _, engine = serve(["metadata.decode_span=0"], steps=steps)
    bs = 16
    buckets = engine.metadata.buckets
    assert steps and all(s.needed for s in steps)
    for s in steps:
        parts = []
        if s.prefill:
            # independently from the plan's chunks: rows, widest chunk in blocks, widest table
            widest = max(c["end"] - c["start"] for c in s.prefill)
            expected = [len(s.prefill), blocks_for(widest, bs) * bs]
            expected.append(max(blocks_for(c["end"], bs) for c in s.prefill))
            assert s.needed["prefill"] == expected
            shape, _ = buckets.pad(
                "prefill", dict(zip(("batch", "seq", "blocks"), expected, strict=True))
            )
            parts.append("prefill " + "x".join(map(str, shape)))
        if s.decode:
            assert s.needed["decode"][0] == len(s.decode)
            shape, _ = buckets.pad(
                "decode", dict(zip(("batch", "blocks"), s.needed["decode"], strict=True))
            )
            parts.append("decode " + "x".join(map(str, shape)))
        assert " + ".join(parts) == s.bucket


def test_evaluating_the_runs_own_set_reproduces_its_padding_and_misses(tmp_path):
    overrides = ["metadata.decode_batch.max=4", "metadata.decode_batch.step=2"]
    folder, records, (_, engine) = write_run(tmp_path / "run", overrides)
    limits = run_limits(folder)
    result = evaluate(Workload.of(records), limits.buckets("linear"), limits.rule)
    assert result.padded_tokens == sum(r["padded_tokens"] for r in records)
    assert result.misses == engine.metadata.bucket_misses > 0


# -- counting and the warmup budget -----------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["max_tokens=100", "metadata.prefill_seq.step=32"],
        ["metadata.bucketing=exponential", "max_model_len=512"],
        ["metadata.prefill_seq.sizes=[32,48,96]", "metadata.decode_batch.sizes=[1,3,8]"],
    ],
)
def test_counting_equals_the_listed_graphs(overrides):
    engine, _ = build_engine(make_config(overrides))
    for mixed, padded in itertools.product((True, False), (True, False)):
        seen: set = set()
        for phase, pairs in engine.metadata.warmup_shapes(mixed, padded).items():
            new = {g for p, d in pairs for g in step_graphs(p, d, False)} - seen
            assert engine.metadata.warmup_counts(mixed, padded)[phase] == len(new)
            seen |= new


def test_counting_a_huge_set_needs_no_list():
    n = 4000
    sizes = {
        "prefill_batch": list(range(1, n + 1)),
        "prefill_seq": list(range(16, 16 * n + 1, 16)),
        "prefill_blocks": list(range(1, n + 1)),
        "decode_batch": list(range(1, n + 1)),
        "decode_blocks": list(range(1, n + 1)),
    }
    counts = warmup_counts(sizes, 16, 16 * n, mixed=True)
    # by hand: seq 16j allows batch <= n / j, tables m >= j: sum_j floor(n/j) * (n - j + 1);
    # b decode rows list b blocks at least: sum_b (n - b + 1); the mixed grid adds none
    j = np.arange(1, n + 1)
    assert counts["prefill"] == int(((n // j) * (n - j + 1)).sum())
    assert counts["decode"] == n * (n + 1) // 2
    assert counts["mixed"] == 0


def test_a_set_beyond_the_warmup_budget_stops_before_compiling():
    engine, _ = build_engine(make_config(["warmup=true", "metadata.max_warmup_shapes=10"]))
    total = sum(engine.metadata.warmup_counts(mixed=True).values())
    with pytest.raises(ConfigError) as err:
        engine.warmup()
    message = str(err.value)
    assert f"{total:,} shapes" in message and "\n" not in message
    for key in ("metadata.bucketing=exponential", ".step", ".sizes"):
        assert key in message


@pytest.mark.slow
def test_the_warmup_budget_exits_2_from_the_command_line(tmp_path):
    done = run_cli(
        tmp_path, "pipeline", *LIMITS, ONE_THREAD, "warmup=true", "metadata.max_warmup_shapes=5",
        "workload.num_requests=1", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "metadata.max_warmup_shapes=5" in errors[0]


# -- optimality -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_one_axis_breakpoints_are_optimal(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 16, size=30)  # few distinct values: brute force stays quick
    weights = rng.integers(1, 5, size=30).astype(float)
    table = breakpoint_table(values, weights, k_max=8)
    for k, (cost, sizes) in enumerate(table, start=1):
        assert len(sizes) == k and max(sizes) == values.max()
        assert cost == pytest.approx(padded_sum(values, weights, sizes))
        best = min(padded_sum(values, weights, s) for s in subsets_with_max(values) if len(s) == k)
        assert cost == pytest.approx(best)


def test_one_axis_hand_made_case():
    # values 1, 2, 8, 9 once each: with two sizes, {2, 9} pads 1 -> 2 and 8 -> 9: 22
    assert breakpoint_table(np.array([1, 2, 8, 9]), np.ones(4), 2)[1] == (22.0, [2, 9])


@pytest.mark.parametrize("seed", range(4))
def test_prefill_pair_is_optimal(seed):
    rng = np.random.default_rng(seed)
    batch = rng.integers(1, 7, size=25)
    seq = rng.integers(1, 7, size=25) * 16
    for k_batch, k_seq in [(1, 2), (2, 2), (3, 2), (2, 4)]:
        cost, batch_sizes, seq_sizes = plan_prefill_pair(batch, seq, k_batch, k_seq)
        assert cost == pytest.approx(
            float((pad_to(batch, batch_sizes) * pad_to(seq, seq_sizes)).sum())
        )
        best = min(
            float((pad_to(batch, bs) * pad_to(seq, ss)).sum())
            for bs in subsets_with_max(batch.tolist())
            for ss in subsets_with_max(seq.tolist())
            if len(bs) == min(k_batch, len(set(batch.tolist())))
            and len(ss) == min(k_seq, len(set(seq.tolist())))
        )
        assert cost == pytest.approx(best)


def brute_force_plan(workload, max_shapes, block_size, max_tokens, block_cost):
    """Every set of observed sizes per axis: the cheapest whose warmup graphs fit the
    budget (every observed step pads to a warmed bucket: warmup holds what steps reach).
    The cost is a prefill part plus a decode part, and the prefill and decode phases' counts
    bound the total from below, so the choices are tried cheapest first and only those whose
    phases fit are counted in full: the first that fits is the cheapest of all."""
    values = workload.axis_values()
    names = list(values)
    # each axis's candidate size sets with its values padded to them, padded once
    options = [
        [(sizes, pad_to(values[n], sizes)) for sizes in subsets_with_max(values[n].tolist())]
        for n in names
    ]
    prefills = list(itertools.product(*options[:3]))
    decodes = list(itertools.product(*options[3:]))
    p_cost = np.array(
        [(pb * ps).sum() + block_cost * (pm - values["prefill_blocks"]).sum()
         for (_, pb), (_, ps), (_, pm) in prefills]
    )  # fmt: skip
    d_cost = np.array(
        [
            db.sum() + block_cost * (dm - values["decode_blocks"]).sum()
            for (_, db), (_, dm) in decodes
        ]
    )
    p_count = np.array(
        [prefill_count(b, s, m, block_size, max_tokens) for (b, _), (s, _), (m, _) in prefills]
    )
    d_count = np.array([decode_count(b, m) for (b, _), (m, _) in decodes])
    cost = p_cost[:, None] + d_cost[None, :]
    fits_phases = p_count[:, None] + d_count[None, :] <= max_shapes
    for flat in np.argsort(np.where(fits_phases, cost, np.inf), axis=None, kind="stable"):
        i, j = np.unravel_index(flat, cost.shape)
        if not fits_phases[i, j]:
            return None
        choice = (*prefills[i], *decodes[j])
        sizes = dict(zip(names, [c[0] for c in choice], strict=True))
        if sum(warmup_counts(sizes, block_size, max_tokens, mixed=True).values()) <= max_shapes:
            return float(cost[i, j]), sizes
    return None


HAND_MADE = Workload(
    # (batch, seq, blocks) prefills and (batch, blocks) decodes, block_size 16; max_tokens
    # 64 bounds which batch x seq corners steps reach, so the count couples the axes
    prefill=np.array([[4, 16, 1], [4, 16, 3], [1, 64, 4], [2, 32, 2], [1, 32, 6], [3, 16, 5]]),
    decode=np.array([[1, 2], [2, 3], [5, 9], [6, 12], [6, 14], [3, 5]]),
    real_tokens=200,
)


RULE = StepRule(block_size=16, max_tokens=64, mixed=True)


@pytest.mark.parametrize("max_shapes", [12])
def test_the_whole_plan_is_optimal_on_a_hand_made_workload(max_shapes):
    brute = brute_force_plan(HAND_MADE, max_shapes, 16, 64, block_cost=0.1 * 16)
    if brute is None:  # nothing fits: the planner says so
        with pytest.raises(ValueError, match="raise --max-shapes"):
            plan_buckets(HAND_MADE, max_shapes, RULE, 0.1)
        return
    plan = plan_buckets(HAND_MADE, max_shapes, RULE, 0.1)
    reached = evaluate(HAND_MADE, Buckets("linear", _axes(plan.sizes)), RULE)
    assert reached.misses == reached.unwarmed == 0 and reached.num_shapes <= max_shapes
    # the plan's own account of its cost, the evaluation's, and the brute force agree
    assert plan.cost == pytest.approx(reached.padded_tokens + 1.6 * reached.padded_blocks)
    assert plan.cost == pytest.approx(brute[0])


def _axes(sizes):
    return {name: Axis(s[0], 1, s[-1], tuple(s)) for name, s in sizes.items()}


# -- coverage on the planned workload and off it ----------------------------------------------


def test_plan_covers_its_workload_and_another_within_the_config(tmp_path, reference_run):
    folder, records, _ = write_run(tmp_path / "run", [])
    plan, results = plan_source(folder, 48, tmp_path / "plan", "planned", block_weight=0.005)
    assert results["plan"].misses == results["plan"].unwarmed == 0
    planned = [f"hydra.searchpath=[file://{tmp_path / 'plan'}]", "+buckets=planned"]
    steps: list = []
    got, engine = serve(planned, steps=steps)
    assert engine.metadata.bucket_misses == 0
    assert sum(s.padded_tokens for s in steps) == results["plan"].padded_tokens
    ref, _ = reference_run
    assert all(got[rid].output_ids == ref[rid].output_ids for rid in ref)
    # Another workload: longer prompts, more at once. The plan ends at the config's limits
    # and warmup holds every bucket a step reaches: no miss, and no graph warmup skipped.
    other = ["workload.num_requests=8", "workload.max_prompt_tokens=240", "workload.seed=5"]
    base, _ = serve(other)
    steps = []
    off, engine = serve([*other, *planned], steps=steps)
    assert engine.metadata.bucket_misses == 0
    sizes = {n: v.tolist() for n, v in engine.metadata.buckets.sizes.items()}
    rule = run_limits(folder).rule
    for record in steps:
        prefill, decode = bucket_dims(record.bucket)
        assert prefill is None or is_warmed("prefill", prefill, sizes, rule)
        assert decode is None or is_warmed("decode", decode, sizes, rule)
    assert set(off) == set(base) and all(r.finish_reason != "error" for r in off.values())
    assert all(off[rid].output_ids == base[rid].output_ids for rid in base)


def test_plan_beats_exponential_and_matches_linear_on_its_workload(tmp_path):
    folder, _, _ = write_run(tmp_path / "run", [])
    _, results = plan_source(folder, 64, tmp_path / "plan", "planned", block_weight=0.0)
    plan, linear, exponential = (results[k] for k in ("plan", "linear", "exponential"))
    assert plan.num_shapes <= 64 < linear.num_shapes
    assert plan.utilization >= linear.utilization
    assert plan.utilization > exponential.utilization


# -- the command line -------------------------------------------------------------------------


def test_cli_plans_from_a_sweep_and_shows_a_run(tmp_path, capsys):
    write_run(tmp_path / "sweep" / "0", [])
    write_run(tmp_path / "sweep" / "1", ["workload.seed=3"])
    assert buckets_main(["plan", str(tmp_path / "sweep"), "--max-shapes", "50",
                         "--out", str(tmp_path / "out")]) == 0  # fmt: skip
    report = (tmp_path / "out" / "report.md").read_text()
    assert "2 run(s)" in report and "| b0.001 |" in report and "| exponential |" in report
    assert (tmp_path / "out" / "buckets" / "planned.yaml").is_file()
    capsys.readouterr()
    assert buckets_main(["show", str(tmp_path / "sweep" / "0")]) == 0
    shown = capsys.readouterr().out
    records = [json.loads(x) for x in (tmp_path / "sweep" / "0" / "steps.jsonl").open()]
    real = sum(r["num_tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    assert f"token utilization {real / padded:.3f}" in shown
    assert records[0]["bucket"] in shown


def test_cli_refuses_a_folder_without_steps(tmp_path, capsys):
    assert buckets_main(["plan", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no steps.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(4))
def test_mixed_count_matches_the_listed_phases(seed):
    """The mixed phase's new graphs, counted without lists, equal the listed grid's parts
    that the listed prefill and decode phases lack."""
    rng = np.random.default_rng(seed)

    def axis(low, high, n):
        return sorted(set(rng.integers(low, high, n).tolist()))

    sizes = {
        "prefill_batch": axis(1, 9, 3),
        "prefill_seq": [16 * j for j in axis(1, 20, 6)],
        "prefill_blocks": axis(1, 12, 4),
        "decode_batch": axis(1, 64, 6),
        "decode_blocks": axis(1, 40, 5),
    }
    budget, padded = int(rng.integers(64, 400)), bool(seed % 2)
    prefill = set(
        prefill_shapes(
            sizes["prefill_batch"], sizes["prefill_seq"], sizes["prefill_blocks"], 16, budget,
            padded,
        )
    )  # fmt: skip
    decode = set(decode_shapes(sizes["decode_batch"], sizes["decode_blocks"]))
    pairs = mixed_pairs(sizes, budget)
    listed = {p for p, _ in pairs if p not in prefill} | {d for _, d in pairs if d not in decode}
    assert warmup_counts(sizes, 16, budget, mixed=True, padded_budget=padded)["mixed"] == len(
        listed
    )


def test_a_tail_doubles_up_to_the_limit():
    # by hand: 1851 observed, 20% headroom -> ceil(2221.2) = 2222, then 4444, 8888,
    # then the limit 10240 (where a single jump padded 1852 blocks to 10240)
    assert tail_sizes(np.array([5, 1851]), 10240, 1, 0.2) == [2222, 4444, 8888, 10240]
    assert tail_sizes(np.array([5, 1851]), 2000, 1, 0.2) == [2000]
