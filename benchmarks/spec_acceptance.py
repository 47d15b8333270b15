"""Per-position acceptance of speculative proposals, measured on real generations: what
`speculative.acceptance` takes.

    python -m benchmarks.spec_acceptance FILE.jsonl [--tokens 3] [--method ngram|recorded]
    python -m benchmarks.spec_acceptance RUN_DIR [--tokens 3]

FILE.jsonl holds one generation a line: `prompt_token_ids` and `generated_token_ids`, the
tokens a real model produced (e.g. SpecDecode-Bench's traces of Llama-3.1-8B-Instruct on
H100, github.com/SpecDecode-Bench/simulator, data/llama3.1-8B/combined_*.jsonl). RUN_DIR is
a run folder of this engine with real weights (`python -m pipeline model=gguf ...`): its
finished generations, each with the prompt ids its own workload and tokenizer made.

- `ngram` (prompt lookup, measured here): at each verification step the last n tokens of
  the context (prompt and output so far; n from --max-ngram down to --min-ngram) are looked
  up in the context before them; the k tokens that followed their latest earlier occurrence
  are the proposals. A proposal is accepted while it equals the token the model generated
  there (greedy verification of the model's own output); a step without a match proposes
  nothing and accepts nothing (the simulated device still verifies k: conservative).
- `recorded`: the file's own accepted lengths per output position (`acc_eagle` or another
  --field: `{"acc_len": [...]}`, 1 = the bonus token alone), as an EAGLE head measured them.

Each step accepts m of the k proposals and moves the row m + 1 tokens on. Position i's
acceptance is P(proposal i accepted | proposals 1 .. i-1 accepted), so that
E = 1 + sum_i prod_{j<=i} a_j is the mean tokens a step, as the simulated device reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Tally:
    """Steps that reached each proposal position, and those that had it accepted."""

    tokens: int
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    steps: int = 0
    generated: int = 0

    def __post_init__(self) -> None:
        self.reached = [0] * self.tokens
        self.accepted = [0] * self.tokens

    def add(self, matched: int) -> None:
        """One verification step that accepted `matched` proposals."""
        self.steps += 1
        self.generated += matched + 1
        for i in range(min(matched + 1, self.tokens)):
            self.reached[i] += 1
            self.accepted[i] += i < matched

    def acceptance(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached, strict=True)]

    def tokens_per_step(self) -> float:
        return self.generated / self.steps if self.steps else 1.0


def lookup(context: Sequence[int], tokens: int, min_n: int, max_n: int) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the
    context's last n tokens, the longest n that occurs; [] where none does."""
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        tail = list(context[-n:])
        for start in range(len(context) - n - 1, -1, -1):
            if list(context[start : start + n]) == tail:
                return list(context[start + n : start + n + tokens])
    return []


def ngram_steps(prompt: Sequence[int], output: Sequence[int], tokens: int, ns=(1, 3)) -> list[int]:
    """The proposals each verification step over `output` accepts, prompt lookup
    proposing (ns: the least and the most n-gram length)."""
    accepted, pos = [], 0
    context = list(prompt)
    while pos < len(output):
        proposal = lookup(context, tokens, *ns)
        m = 0
        while m < len(proposal) and pos + m < len(output) and proposal[m] == output[pos + m]:
            m += 1
        m = min(m, len(output) - pos - 1)  # the last token is the step's own
        accepted.append(m)
        context.extend(output[pos : pos + m + 1])
        pos += m + 1
    return accepted


def recorded_steps(lengths: Sequence[int], tokens: int) -> list[int]:
    """The proposals each step accepts where lengths[p] is the span (bonus token
    included) a proposer's draft at output position p gets accepted."""
    accepted, pos = [], 0
    while pos < len(lengths):
        m = min(int(lengths[pos]) - 1, tokens, len(lengths) - pos - 1)
        accepted.append(max(m, 0))
        pos += max(m, 0) + 1
    return accepted


def measure(rows: Iterable[dict], tokens: int, method: str, key: str, ns=(1, 3)) -> Tally:
    tally = Tally(tokens)
    for row in rows:
        if method == "ngram":
            steps = ngram_steps(row["prompt_token_ids"], row["generated_token_ids"], tokens, ns)
        else:
            steps = recorded_steps(row[key]["acc_len"], tokens)
        for m in steps:
            tally.add(m)
    return tally


def run_rows(folder: Path) -> list[dict]:
    """A run folder's finished generations with their prompts' ids, as the run's own
    tokenizer and workload made them."""
    from pipeline import artefacts
    from pipeline.build import build, load_workload

    cfg = artefacts.read_run_config(folder)
    if cfg is None:
        raise ValueError(f"{folder} is not a run folder (no resolved config)")
    _, requests = load_workload(cfg, build(cfg.tokenizer))
    return [
        {"prompt_token_ids": requests[line["index"]].prompt_ids,
         "generated_token_ids": line["output_ids"]}
        for line in artefacts.read_generations(folder / artefacts.GENERATIONS)
        if line.get("error") is None
    ]  # fmt: skip


def read_rows(path: Path) -> list[dict]:
    if path.is_dir():
        return run_rows(path)
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "file", help="JSONL (prompt_token_ids, generated_token_ids a line) or a run folder"
    )
    parser.add_argument("--tokens", type=int, default=3, help="k, proposals a step")
    parser.add_argument("--method", choices=("ngram", "recorded"), default="ngram")
    parser.add_argument("--field", default="acc_eagle", help="--method recorded: the lengths")
    parser.add_argument("--min-ngram", type=int, default=1)
    parser.add_argument("--max-ngram", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="first N generations (0: all)")
    args = parser.parse_args(argv)
    if args.tokens < 1 or not 1 <= args.min_ngram <= args.max_ngram:
        print("Error: --tokens must be >= 1 and 1 <= --min-ngram <= --max-ngram", file=sys.stderr)
        return 2
    try:
        rows = read_rows(Path(args.file))
    except (OSError, ValueError) as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    rows = rows[: args.limit] if args.limit else rows
    ns = (args.min_ngram, args.max_ngram)
    tally = measure(rows, args.tokens, args.method, args.field, ns)
    values = ",".join(f"{a:.3f}" for a in tally.acceptance())
    print(f"{len(rows)} generations, {tally.generated} tokens in {tally.steps} steps")
    for i, (a, r) in enumerate(zip(tally.acceptance(), tally.reached, strict=True), 1):
        print(f"  position {i}: acceptance {a:.3f} ({r} steps reached it)")
    print(f"tokens a step: {tally.tokens_per_step():.3f}")
    print(f"speculative.tokens={args.tokens} speculative.acceptance=[{values}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
