"""The config-diff review: the diff names the changed keys, the verdict finds the first
differing token, bad input gets one line and exit 2, and the gate works on real runs."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.review import config_diff, load_run, main, outputs_verdict
from pipeline.review.render import render_config
from tests.helpers import TINY, markdown_rows, run_cli

CONFIG: dict[str, Any] = {
    "tokenizer": {"_target_": "stages.loading.tokenizer.ByteTokenizer", "add_bos": True},
    "scheduler": {"max_tokens": 512, "align_chunks": True},
    "workload": {"num_requests": 2, "max_new_tokens": 8},
    "max_tokens": 512,
    "seed": 0,
}
PROMPTS = {"req-0": "the block", "req-1": "a cache", "req-2": "a third one"}


def make_run(
    path: Path,
    outputs: dict[str, str],
    config: dict[str, Any] | None = None,
    throughput: float = 100.0,
    overrides: list[str] | None = None,
) -> Path:
    """A run folder with the contract's files; outputs are texts, stored as byte-level ids."""
    (path / ".hydra").mkdir(parents=True)
    (path / "resolved_config.yaml").write_text(yaml.safe_dump(config or CONFIG))
    choices = {"scheduler": "chunked", "schema/scheduler@scheduler": "chunked", "hydra/env": "x"}
    hydra = {"hydra": {"job": {"num": 0}, "runtime": {"choices": choices}}}
    (path / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides or []))
    (path / "metrics.json").write_text(
        json.dumps({"status": "ok", "output_throughput": throughput, "ttft_ms": {"p50": 2.0}})
    )
    with open(path / "generations.jsonl", "w") as f:
        for rid, text in outputs.items():
            line = {"id": rid, "prompt": PROMPTS[rid], "output_ids": list(text.encode())}
            f.write(json.dumps({**line, "output_text": text, "error": None}) + "\n")
    return path


SAME = {"req-0": "hello world", "req-1": "abc"}


def test_config_diff_names_changed_added_and_removed_keys():
    b = copy.deepcopy(CONFIG)
    b["scheduler"]["max_tokens"] = 1024
    b["scheduler"]["long_prefill_threshold"] = 256
    del b["scheduler"]["align_chunks"]
    b["metadata"] = {"bucketing": "linear", "decode_batch": {"min": 1}}
    diff = config_diff(CONFIG, b)
    assert diff["changed"] == {
        "scheduler.max_tokens": {"a": 512, "b": 1024, "effect": "outputs unchanged (timing only)"}
    }
    assert diff["added"] == {
        "scheduler.long_prefill_threshold": 256,
        "metadata.bucketing": "linear",
        "metadata.decode_batch.min": 1,
    }
    assert diff["removed"] == {"scheduler.align_chunks": True}


def test_identical_outputs(tmp_path):
    a = load_run(make_run(tmp_path / "a", SAME))
    b = load_run(make_run(tmp_path / "b", SAME))
    verdict = outputs_verdict(a, b)
    assert (verdict["identical"], verdict["total"], verdict["differences"]) == (2, 2, [])


def test_differing_outputs_name_the_request_and_position(tmp_path):
    a = load_run(make_run(tmp_path / "a", SAME))
    b = load_run(make_run(tmp_path / "b", {"req-0": "hello there", "req-1": "abcdef"}))
    first, second = outputs_verdict(a, b)["differences"]
    assert first["id"] == "req-0" and first["position"] == 6
    # ids, then the text decoded with the run's own tokenizer
    assert first["context"] == "[104, 101, 108, 108, 111, 32] 'hello '"
    assert first["a"] == "[119, 111, 114, 108, 100] 'world'"
    assert first["b"].endswith("'there'")
    # One output a prefix of the other: they part where the shorter one ends.
    assert second["position"] == 3 and second["a"] == "[] ''"
    assert second["b"] == "[100, 101, 102] 'def'"


def review(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_report_and_gate(tmp_path, capsys):
    b_config = copy.deepcopy(CONFIG)
    b_config["scheduler"]["max_tokens"] = 1024
    a = make_run(tmp_path / "a", SAME, overrides=["max_tokens=512"])
    b = make_run(tmp_path / "b", {**SAME, "req-1": "abX"}, b_config, 150.0, ["max_tokens=1024"])

    code, out, _ = review(capsys, a, b)
    assert code == 0
    assert "scheduler.max_tokens: 512 -> 1024" in out
    assert "A: max_tokens=512" in out and "B: max_tokens=1024" in out
    assert "scheduler  chunked  chunked" in out and "schema/" not in out and "hydra/" not in out
    assert "output_throughput  100.0  150.0  50.0   1.500x" in out
    assert "tokens differ for 1/2 requests" in out
    assert (
        "req-1: first differs at token 2" in out and "A: [99] 'c'" in out and "B: [88] 'X'" in out
    )

    assert review(capsys, a, b, "--fail-on-output-diff")[0] == 1
    code, out, _ = review(capsys, a, a, "--fail-on-output-diff")
    assert code == 0 and "identical tokens for 2/2 requests" in out


def test_json_is_one_document(tmp_path, capsys):
    a = make_run(tmp_path / "a", SAME)
    b = make_run(tmp_path / "b", {**SAME, "req-0": "hello World"})
    code, out, _ = review(capsys, a, b, "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["metrics"]["output_throughput"] == {
        "a": 100.0,
        "b": 100.0,
        "delta": 0.0,
        "ratio": 1.0,
    }
    assert doc["outputs"]["identical"] == 1
    assert doc["outputs"]["differences"][0]["position"] == 6


def test_different_workloads_are_not_comparable(tmp_path, capsys):
    other = copy.deepcopy(CONFIG)
    other["workload"]["num_requests"] = 3
    a = make_run(tmp_path / "a", SAME)
    b = make_run(tmp_path / "b", {**SAME, "req-2": "xyz"}, other)

    code, out, err = review(capsys, a, b)
    assert code == 2
    assert "== Config" in out and "== Metrics" in out  # the other parts are still shown
    assert "outputs not comparable" in out
    assert err.count("\n") == 1 and "2 vs 3 requests, 2 in common" in err

    code, _, err = review(capsys, a, b, "--fail-on-output-diff")
    assert code == 1 and "not comparable" in err

    prompts = dict(PROMPTS)
    PROMPTS["req-1"] = "another prompt"  # same ids and count, one prompt changed
    try:
        changed = make_run(tmp_path / "c", SAME)
    finally:
        PROMPTS.update(prompts)
    code, _, err = review(capsys, a, changed)
    assert code == 2 and "request req-1 differs" in err


def test_a_copied_workload_file_is_the_same_workload(tmp_path, capsys):
    # The same requests read from another path: the config differs, the workload does not.
    moved = copy.deepcopy(CONFIG)
    moved["workload"]["path"] = "/elsewhere/prompts.jsonl"
    a = make_run(tmp_path / "a", SAME, {**CONFIG, "workload": {"path": "/here/prompts.jsonl"}})
    b = make_run(tmp_path / "b", SAME, moved)
    code, out, _ = review(capsys, a, b)
    assert code == 0 and "identical tokens for 2/2 requests" in out
    assert "workload.path" in out  # the config diff still shows the move


def test_a_killed_run_is_read_as_interrupted(tmp_path, capsys):
    a = make_run(tmp_path / "a", SAME)
    killed = make_run(tmp_path / "b", {"req-0": "hello world"})
    (killed / "metrics.json").unlink()
    with open(killed / "generations.jsonl", "a") as f:
        f.write('{"id": "req-1", "prompt": "a ca')  # the line a kill cut short
    run = load_run(killed)
    assert run.metrics == {"status": "interrupted"} and [g["id"] for g in run.generations] == [
        "req-0"
    ]
    code, out, _ = review(capsys, a, killed)
    assert code == 0 and "req-1: only in A" in out


def test_bad_folders_exit_2_with_one_line(tmp_path, capsys):
    good = make_run(tmp_path / "good", SAME)
    not_run = tmp_path / "plain"
    not_run.mkdir()
    no_generations = make_run(tmp_path / "failed", SAME)
    (no_generations / "generations.jsonl").unlink()
    (no_generations / "metrics.json").write_text(
        json.dumps({"status": "failed", "error": "block_size=48 is not\na power of two"})
    )
    cases = {
        not_run: "is not a run folder: it has no resolved_config.yaml",
        no_generations: "has no generations.jsonl (its metrics.json says failed: block_size=48",
        tmp_path / "absent": "no such folder",
    }
    for bad, message in cases.items():
        code, out, err = review(capsys, good, bad)
        assert code == 2 and out == ""
        assert message in err and err.count("\n") == 1, err
    code, _, err = review(capsys, good)  # one folder that is not a sweep
    assert code == 2 and "a single run, not a sweep folder" in err
    code, _, err = review(capsys, not_run, "--baseline", "0")
    assert code == 2 and "not a sweep folder" in err


def test_sweep_against_a_baseline(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for num, outputs in enumerate([SAME, SAME, {**SAME, "req-0": "hello"}]):
        make_run(sweep / str(num), outputs, overrides=[f"max_tokens={64 << num}"])
        hydra = {"hydra": {"job": {"num": num}, "runtime": {"choices": {}}}}
        (sweep / str(num) / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))

    code, out, _ = review(capsys, sweep, "--baseline", "1")
    assert code == 0
    assert "job 0 (max_tokens=64): identical tokens for 2/2 requests" in out
    assert "job 2 (max_tokens=256): tokens differ for 1/2 requests" in out
    assert review(capsys, sweep, "--baseline", "1", "--fail-on-output-diff")[0] == 1

    code, out, _ = review(capsys, sweep, "--baseline", "0", "--json")
    assert [r["job"] for r in json.loads(out)["reviews"]] == [1, 2]

    code, _, err = review(capsys, sweep, "--baseline", "9")
    assert code == 2 and "has no job 9 (its jobs: 0, 1, 2)" in err


# ----------------------------------------------------------------------- real runs


def cli(cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(cwd, module, *args)


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory) -> Path:
    """Three real jobs: a budget change (greedy tokens must not move) and new model weights."""
    root = tmp_path_factory.mktemp("real")
    sweep = root / "sweep"
    # model.seed changes the weights but not the workload, which follows the top-level seed.
    grid = "max_tokens=32,64", "model.seed=0,1"
    result = cli(root, "pipeline", "-m", f"hydra.sweep.dir={sweep}", *grid, *TINY)
    assert result.returncode == 0, result.stderr
    return sweep


def job_dir(sweep: Path, *overrides: str) -> Path:
    for path in sweep.iterdir():
        given = path / ".hydra" / "overrides.yaml"
        if given.is_file() and set(overrides) <= set(yaml.safe_load(given.read_text())):
            return path
    raise LookupError(overrides)


@pytest.mark.slow
def test_review_of_real_runs(real_sweep):
    base = job_dir(real_sweep, "max_tokens=32", "model.seed=0")
    budget = job_dir(real_sweep, "max_tokens=64", "model.seed=0")
    weights = job_dir(real_sweep, "max_tokens=32", "model.seed=1")

    same = cli(real_sweep, "pipeline.review", base, budget, "--fail-on-output-diff")
    assert same.returncode == 0, same.stderr
    # the top-level key once, its group copies named beside it, and what it does
    assert "  max_tokens: 32 -> 64  [outputs unchanged (timing only)] (also " in same.stdout
    assert "scheduler.max_tokens: 32 -> 64" not in same.stdout
    assert "identical tokens for 3/3 requests" in same.stdout

    differ = cli(real_sweep, "pipeline.review", base, weights, "--fail-on-output-diff")
    assert differ.returncode == 1, differ.stderr
    assert "model.seed: 0 -> 1" in differ.stdout
    assert "tokens differ for" in differ.stdout and "first differs at token" in differ.stdout


@pytest.mark.slow
def test_real_sweep_summary_and_baseline_review(real_sweep):
    assert (real_sweep / "summary.png").is_file()
    md = (real_sweep / "summary.md").read_text()
    assert "Swept: `max_tokens`, `model.seed`" in md
    assert [row["status"] for row in markdown_rows(md)] == ["ok"] * 4

    result = cli(real_sweep, "pipeline.review", real_sweep, "--baseline", "0", "--json")
    assert result.returncode == 0, result.stderr
    reviews = json.loads(result.stdout)["reviews"]
    assert len(reviews) == 3 and all(r["outputs"]["comparable"] for r in reviews)


def test_bucket_lists_show_as_lists_and_what_was_in_force():
    axes = ("prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch", "decode_blocks")
    a = {"metadata": {"bucketing": "exponential", **{x: {"min": 0, "sizes": None} for x in axes}}}
    b = copy.deepcopy(a)
    b["metadata"]["bucketing"] = "linear"
    b["metadata"]["prefill_batch"]["min"] = 2
    for axis in axes:
        b["metadata"][axis]["sizes"] = [1, 4, 16]
    a["metadata"]["decode_batch"]["sizes"] = [1, 2]
    diff = config_diff(a, b)
    assert diff["changed"]["metadata.decode_batch.sizes"] == {
        "a": [1, 2],
        "b": [1, 4, 16],
        "effect": "outputs unchanged (timing only)",
    }
    assert diff["changed"]["metadata.prefill_seq.sizes"] == {
        "a": None,
        "b": [1, 4, 16],
        "effect": "outputs unchanged (timing only)",
    }
    assert not any("[" in key for part in diff.values() for key in part)
    # every axis of B has sizes: the strategy and prefill_batch.min were not in force there
    assert diff["changed"]["metadata.bucketing"]["note"].startswith("not in force in B")
    assert "not in force in B" in diff["changed"]["metadata.prefill_batch.min"]["note"]
    shown = "\n".join(render_config({**diff, "choices": {"a": {}, "b": {}},
                                      "overrides": {"a": [], "b": []}}))  # fmt: skip
    assert "metadata.decode_batch.sizes: [1, 2] -> [1, 4, 16]" in shown
    assert "(not in force in B" in shown


def test_which_keys_change_outputs():
    from pipeline.run_folder.output_keys import Effect, echoes, effect

    assert effect("model.rope_theta") is Effect.changes
    assert effect("sampler.temperature") is Effect.changes and effect("seed") is Effect.changes
    for key in ("max_tokens", "block_size", "scheduler.max_tokens", "metadata.bucketing",
                "prefix_caching", "hardware.compile_s"):  # fmt: skip
        assert effect(key) is Effect.timing, key
    assert effect("attention._target_") is Effect.numerics
    assert echoes("scheduler.max_tokens", {"max_tokens": 512}) == "max_tokens"
    assert echoes("model.rope_theta", {"max_tokens": 512}) is None


def test_simulated_runs_tokens_are_not_compared(tmp_path):
    from pipeline.review.outputs import outputs_verdict, verdict_line
    from pipeline.review.runs import Run

    gens = [{"id": "r0", "prompt": "p", "output_ids": [0, 0]}]
    a = Run(tmp_path, {}, {}, [], {"simulated": True}, gens)
    b = Run(tmp_path, {}, {}, [], {"simulated": True}, gens)
    verdict = outputs_verdict(a, b)
    assert verdict["placeholders"] and "identical" not in verdict_line(verdict)
    assert "placeholders" in verdict_line(verdict)


def test_no_slo_figures_without_an_slo_and_the_reference_graphs_explained():
    from pipeline.review.compare import metrics_table
    from pipeline.review.render import graph_note

    no_slo = {"output_throughput": 1.0, "slo": {"attainment": 0.9}, "slo_met": True,
              "slo_attainment": 1.0, "request_goodput": 2.0, "warmup_shapes": 182}  # fmt: skip
    table = metrics_table(no_slo, {**no_slo, "warmup_shapes": 155})
    assert not any(k.startswith(("slo", "request_goodput")) for k in table)
    with_slo = {**no_slo, "slo": {"ttft_ms": 500, "attainment": 0.9}}
    assert "slo_met" in metrics_table(with_slo, no_slo)
    cfg = {"choices": {"a": {"attention": "hpu"}, "b": {"attention": "reference"}}}
    note = graph_note(cfg, table)
    assert note and "182 (A, attention=hpu) vs 155 (B, attention=reference)" in note[0]
    assert "no prefix caching" in note[0]


def test_review_of_two_simulated_runs_is_no_error(tmp_path):
    import json as _json

    from pipeline.review import main as review_main

    for side in ("a", "b"):
        folder = tmp_path / side
        folder.mkdir()
        (folder / "resolved_config.yaml").write_text("max_tokens: 512\n")
        (folder / "metrics.json").write_text(_json.dumps({"status": "ok", "simulated": True}))
        (folder / "generations.jsonl").write_text(
            _json.dumps({"id": "r0", "prompt": "p", "output_ids": [0]}) + "\n"
        )
    assert review_main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
