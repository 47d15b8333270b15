"""Per-position acceptance of speculative proposals, measured on real generations: what
`speculative.acceptance` takes.

    python -m benchmarks.spec_acceptance FILE.jsonl [--tokens 3] [--method ngram|recorded]
    python -m benchmarks.spec_acceptance FILE.jsonl --method recorded --field acc_ngram \
        --lookup-proposes --min-ngram 3
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
  nothing (vLLM verifies nothing for such a row) and moves the row one token on.
- `recorded`: the file's own accepted lengths per output position (`acc_eagle` or another
  --field: `{"acc_len": [...]}`, 1 = the bonus token alone), as an EAGLE head measured them.
  With --lookup-proposes a step proposes only where prompt lookup (--min-ngram ..
  --max-ngram) finds a match: for spans a prompt-lookup proposer recorded (`acc_ngram`).

Each step accepts m of the k proposals and moves the row m + 1 tokens on. The proposal
rate is the share of steps that propose (`speculative.proposal_rate`); position i's
acceptance is P(proposal i accepted | proposals 1 .. i-1 accepted) over the steps that
propose, so that 1 + rate x sum_i prod_{j<=i} a_j is the mean tokens a step, as the
simulated device reads them.
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
    proposing: int = 0
    generated: int = 0

    def __post_init__(self) -> None:
        self.reached = [0] * self.tokens
        self.accepted = [0] * self.tokens

    def add(self, matched: int, proposed: bool = True) -> None:
        """One step that accepted `matched` proposals (none, where it proposed none)."""
        self.steps += 1
        self.generated += matched + 1
        if not proposed and not matched:
            return
        self.proposing += 1
        for i in range(min(matched + 1, self.tokens)):
            self.reached[i] += 1
            self.accepted[i] += i < matched

    def acceptance(self) -> list[float]:
        """Each position's acceptance over the steps that proposed."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached, strict=True)]

    def proposal_rate(self) -> float:
        return self.proposing / self.steps if self.steps else 1.0

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


Step = tuple[int, bool]  # proposals a step accepted, and whether it proposed any


def ngram_steps(prompt: Sequence[int], output: Sequence[int], tokens: int, ns=(1, 3)) -> list[Step]:
    """The proposals each step over `output` accepts, prompt lookup proposing (ns: the
    least and the most n-gram length), and whether it found any to propose."""
    steps, pos = [], 0
    context = list(prompt)
    while pos < len(output):
        proposal = lookup(context, tokens, *ns)
        m = 0
        while m < len(proposal) and pos + m < len(output) and proposal[m] == output[pos + m]:
            m += 1
        m = min(m, len(output) - pos - 1)  # the last token is the step's own
        steps.append((m, bool(proposal)))
        context.extend(output[pos : pos + m + 1])
        pos += m + 1
    return steps


def recorded_lookup_steps(
    prompt: Sequence[int], output: Sequence[int], lengths: Sequence[int], tokens: int, ns=(3, 3)
) -> list[Step]:
    """recorded_steps' steps, each proposing where prompt lookup over the context so far
    finds a match (a prompt-lookup proposer's recorded spans)."""
    steps, pos, context = [], 0, list(prompt)
    for m in recorded_steps(lengths, tokens):
        steps.append((m, bool(lookup(context, tokens, *ns))))
        context.extend(output[pos : pos + m + 1])
        pos += m + 1
    return steps


def recorded_steps(lengths: Sequence[int], tokens: int) -> list[int]:
    """The proposals each step accepts where lengths[p] is the span (bonus token
    included) a proposer's draft at output position p gets accepted."""
    accepted, pos = [], 0
    while pos < len(lengths):
        m = min(int(lengths[pos]) - 1, tokens, len(lengths) - pos - 1)
        accepted.append(max(m, 0))
        pos += max(m, 0) + 1
    return accepted


def measure(
    rows: Iterable[dict], tokens: int, method: str, key: str, ns=(1, 3), by_lookup: bool = False
) -> Tally:
    """by_lookup: `recorded` steps propose only where prompt lookup finds a match."""
    tally = Tally(tokens)
    for row in rows:
        prompt, output = row["prompt_token_ids"], row["generated_token_ids"]
        if method == "ngram":
            steps = ngram_steps(prompt, output, tokens, ns)
        elif by_lookup:
            steps = recorded_lookup_steps(prompt, output, row[key]["acc_len"], tokens, ns)
        else:
            steps = [(m, True) for m in recorded_steps(row[key]["acc_len"], tokens)]
        for m, proposed in steps:
            tally.add(m, proposed)
    return tally


def run_rows(folder: Path) -> list[dict]:
    """A run folder's finished generations with their prompts' ids, as the run's own
    tokenizer and workload made them."""
    from pipeline.executors.build import build, load_workload
    from pipeline.run_folder import artefacts

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
    parser.add_argument(
        "--lookup-proposes",
        action="store_true",
        help="--method recorded: a step proposes only where prompt lookup finds a match",
    )
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
    tally = measure(rows, args.tokens, args.method, args.field, ns, args.lookup_proposes)
    values = ",".join(f"{a:.3f}" for a in tally.acceptance())
    rate = tally.proposal_rate()
    print(f"{len(rows)} generations, {tally.generated} tokens in {tally.steps} steps")
    print(f"  proposing steps: {tally.proposing} ({rate:.3f} of all)")
    for i, (a, r) in enumerate(zip(tally.acceptance(), tally.reached, strict=True), 1):
        print(f"  position {i}: acceptance {a:.3f} ({r} steps reached it)")
    print(f"tokens a step: {tally.tokens_per_step():.3f}")
    keys = f"speculative.tokens={args.tokens} speculative.acceptance=[{values}]"
    keys += f" speculative.proposal_rate={rate:.3f}" if rate < 1.0 else ""
    # what a plan needs to count the values as measured (pipeline/plan/acceptance.py)
    print(f"{keys} speculative.acceptance_from=spec_acceptance:{Path(args.file).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
