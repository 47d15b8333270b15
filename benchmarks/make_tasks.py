"""Writes the evaluation tasks `python -m benchmarks.accuracy` runs: items generated here,
from a fixed seed (nothing taken from any benchmark's data), as JSONL beside their lm-eval
task YAML in benchmarks/tasks/.

    python -m benchmarks.make_tasks            (rewrites benchmarks/tasks/*.jsonl)

hpu_arith_choice (multiple choice, scored by log-likelihood): sums, differences, products
and which of four numbers is the smallest or largest; four choices, one right.
hpu_unit_conversion (generation, exact match): how many of a smaller unit are in a whole
number of a larger one. Each task has a test split (300 items) and a few-shot split (20).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

TASKS = Path(__file__).parent / "tasks"
SEED = 51
TEST, FEWSHOT = 300, 20

# (larger unit, smaller unit, how many of the smaller in one of the larger)
UNITS = [
    ("metres", "centimetres", 100),
    ("kilometres", "metres", 1000),
    ("kilograms", "grams", 1000),
    ("litres", "millilitres", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("feet", "inches", 12),
    ("dozens", "items", 12),
]


def near_misses(rng: random.Random, answer: int) -> list[int]:
    """Three wrong choices close to the answer (off by one or by ten), distinct, >= 0."""
    offsets = [-10, -2, -1, 1, 2, 10]
    rng.shuffle(offsets)
    wrong = [answer + d for d in offsets if answer + d >= 0]
    return wrong[:3]


def arithmetic_item(rng: random.Random) -> dict:
    kind = rng.choice(["sum", "difference", "product", "smallest", "largest"])
    if kind in ("smallest", "largest"):
        numbers = rng.sample(range(10, 100), 4)
        question = f"Which number is the {kind}: {', '.join(map(str, numbers))}?"
        answer = min(numbers) if kind == "smallest" else max(numbers)
        choices = [str(n) for n in numbers]
        return {"question": question, "choices": choices, "answer": choices.index(str(answer))}
    if kind == "product":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        question, answer = f"What is {a} times {b}?", a * b
    else:
        a, b = sorted((rng.randint(10, 99), rng.randint(10, 99)), reverse=kind == "difference")
        sign = "+" if kind == "sum" else "-"
        question, answer = f"What is {a} {sign} {b}?", a + b if kind == "sum" else a - b
    numbers = [answer, *near_misses(rng, answer)]
    rng.shuffle(numbers)
    return {"question": question, "choices": [str(n) for n in numbers],
            "answer": numbers.index(answer)}  # fmt: skip


def conversion_item(rng: random.Random) -> dict:
    large, small, factor = rng.choice(UNITS)
    count = rng.randint(2, 50)
    question = f"How many {small} are in {count} {large}?"
    return {"question": question, "answer": str(count * factor)}


def items(make, rng: random.Random, count: int, seen: set[str]) -> list[dict]:
    """`count` items with questions not seen before (none shared between splits)."""
    out: list[dict] = []
    for _ in range(100 * count):  # bounded: the spaces hold far more items than asked
        if len(out) == count:
            break
        item = make(rng)
        if item["question"] not in seen:
            seen.add(item["question"])
            out.append(item)
    return out


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def generate(out: Path = TASKS) -> dict[str, int]:
    """Writes every task's splits into `out`; returns each file's item count."""
    counts = {}
    for name, make in (("arith_choice", arithmetic_item), ("unit_conversion", conversion_item)):
        rng, seen = random.Random(f"{SEED}-{name}"), set()
        for split, count in (("fewshot", FEWSHOT), ("test", TEST)):
            rows = items(make, rng, count, seen)
            write(out / f"{name}_{split}.jsonl", rows)
            counts[f"{name}_{split}"] = len(rows)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TASKS, help="folder (default: %(default)s)")
    args = parser.parse_args()
    for name, count in generate(args.out).items():
        print(f"{name}: {count} items")


if __name__ == "__main__":
    main()
