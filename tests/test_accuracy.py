"""The evaluation tasks and `python -m benchmarks.accuracy`: every item's answer against
one worked out here from its question alone, the shipped files as the generator writes
them, and (with lm-eval installed, the `eval` extra) a whole run on the tiny model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks import make_tasks
from tests.helpers import REPO

TASKS = REPO / "benchmarks" / "tasks"
# How many of the smaller unit make one of the larger: written out again, not imported.
FACTORS = {("centimetres", "metres"): 100, ("metres", "kilometres"): 1000,
           ("grams", "kilograms"): 1000, ("millilitres", "litres"): 1000,
           ("minutes", "hours"): 60, ("seconds", "minutes"): 60, ("hours", "days"): 24,
           ("days", "weeks"): 7, ("inches", "feet"): 12, ("items", "dozens"): 12}  # fmt: skip


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / name).read_text().splitlines()]


def worked_choice(question: str) -> int:
    numbers = [int(n) for n in re.findall(r"\d+", question)]
    if "smallest" in question:
        return min(numbers)
    if "largest" in question:
        return max(numbers)
    a, b = numbers
    return {"+": a + b, "-": a - b, "times": a * b}[
        re.search(r"(\+|-|times)", question).group(1)  # type: ignore[union-attr]
    ]


def test_the_shipped_items_are_what_the_generator_writes(tmp_path):
    counts = make_tasks.generate(tmp_path)
    for name in counts:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (TASKS / f"{name}.jsonl").read_bytes()
    assert counts["arith_choice_test"] >= 300 and counts["unit_conversion_test"] >= 300


def test_every_choice_item_has_one_right_answer():
    for split in ("fewshot", "test"):
        for item in read(f"arith_choice_{split}.jsonl"):
            choices = item["choices"]
            assert len(set(choices)) == 4
            assert int(choices[item["answer"]]) == worked_choice(item["question"])


def test_every_conversion_answer_is_right():
    questions = set()
    for split in ("fewshot", "test"):
        for item in read(f"unit_conversion_{split}.jsonl"):
            small, count, large = re.fullmatch(
                r"How many (\w+) are in (\d+) (\w+)\?", item["question"]
            ).groups()  # type: ignore[union-attr]
            assert int(item["answer"]) == int(count) * FACTORS[(small, large)]
            assert item["question"] not in questions  # no item in both splits
            questions.add(item["question"])


def test_task_yamls_read_the_shipped_files():
    for path in TASKS.glob("*.yaml"):
        task = yaml.safe_load(path.read_text())
        assert task["dataset_path"] == "json" and task["task"] == path.stem
        for file in task["dataset_kwargs"]["data_files"].values():
            assert (REPO / file).is_file()


def test_the_accuracy_command_runs_lm_eval_on_the_server(tmp_path):
    pytest.importorskip("lm_eval", reason="optional: the `eval` extra (lm-eval)")
    from benchmarks import accuracy

    out = tmp_path / "run"
    code = accuracy.main(["model=tiny", "max_num_seqs=2", "max_model_len=512",
                          "--limit", "3", "--out", str(out)])  # fmt: skip
    assert code == 0, (out / "lm_eval.log").read_text()[-2000:]
    results = json.loads((out / "lm_eval_results.json").read_text())["results"]
    assert {"hpu_arith_choice", "hpu_unit_conversion"} <= results.keys()
    assert "acc_stderr,none" in results["hpu_arith_choice"]
    assert Path(out / "server" / "metrics.json").is_file()


def test_the_chat_mode_runs_lm_eval_on_the_chat_route(tmp_path):
    """--chat: lm-eval's local-chat-completions, the few-shot prompt as chat messages the
    server templates, on the generation task only (chat has no log-likelihoods)."""
    pytest.importorskip("lm_eval", reason="optional: the `eval` extra (lm-eval)")
    from benchmarks import accuracy

    out = tmp_path / "run"
    code = accuracy.main(["--chat", "model=tiny", "max_num_seqs=2", "max_model_len=512",
                          "--limit", "2", "--out", str(out)])  # fmt: skip
    assert code == 0, (out / "lm_eval.log").read_text()[-2000:]
    command = (out / "lm_eval_command.txt").read_text()
    assert "local-chat-completions" in command and "/v1/chat/completions" in command
    assert "--apply_chat_template" in command
    results = json.loads((out / "lm_eval_results.json").read_text())["results"]
    assert results.keys() == {"hpu_unit_conversion"}
    assert "exact_match_stderr,first_number" in results["hpu_unit_conversion"]
    served = json.loads((out / "server" / "metrics.json").read_text())
    assert served["num_requests"] == 2 and served["num_errors"] == 0


def write_samples(run: Path, choice_scores: list[list[float]], texts: list[str]) -> None:
    folder = run / "lm_eval" / "model"
    folder.mkdir(parents=True)
    choice = [{"doc_id": i, "metrics": ["acc"], "filtered_resps": [[str(x), "False"] for x in s]}
              for i, s in enumerate(choice_scores)]  # fmt: skip
    gen = [{"doc_id": i, "metrics": ["exact_match"], "filtered_resps": [t]}
           for i, t in enumerate(texts)]  # fmt: skip
    for task, rows in (("hpu_arith_choice", choice), ("hpu_unit_conversion", gen)):
        path = folder / f"samples_{task}_2026-01-01T00-00-00.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_compare_counts_items_with_the_same_answer(tmp_path, capsys):
    from benchmarks import accuracy

    write_samples(tmp_path / "a", [[-1.0, -2.0], [-3.0, -1.0]], ["700", "12"])
    write_samples(tmp_path / "b", [[-1.5, -2.0], [-0.5, -1.0], [-1.0, -1.0]], ["700", "13"])
    assert accuracy.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "hpu_arith_choice  same answer on 1/2 items, log-likelihoods within 2.50e+00",
        "hpu_unit_conversion  same answer on 1/2 items",
    ]


@pytest.mark.slow
def test_the_reference_scores_the_items_as_the_server(tmp_path, torch, transformers):
    """--reference: lm-eval's hf model (transformers reading a tiny GGUF) gives the server's
    answers and log-likelihoods on the same items."""
    pytest.importorskip("lm_eval", reason="optional: the `eval` extra (lm-eval)")
    pytest.importorskip("accelerate", reason="optional: the `peer` extra (accelerate)")
    from benchmarks import accuracy
    from tests.gguf_files import hf_weights, model_config, train_vocab, write_model

    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), tied=False)
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.gguf"
    write_model(path, config, hf_weights(config, rng), {}, vocab, rng)
    task = ["--tasks", "hpu_arith_choice", "--limit", "2"]
    served, reference = tmp_path / "served", tmp_path / "reference"
    code = accuracy.main(["model=gguf", f"model.path={path}", "max_model_len=512",
                          *task, "--out", str(served)])  # fmt: skip
    assert code == 0, (served / "lm_eval.log").read_text()[-2000:]
    code = accuracy.main(["--reference", str(path), *task, "--out", str(reference)])
    assert code == 0, (reference / "lm_eval.log").read_text()[-2000:]
    a, b = accuracy.answers(served)["hpu_arith_choice"], accuracy.answers(reference)
    b = b["hpu_arith_choice"]
    assert a.keys() == b.keys() == {0, 1}
    for item, (answer, scores) in a.items():
        assert answer == b[item][0]
        assert np.allclose(scores, b[item][1], atol=1e-3), item
