"""This engine against Hugging Face transformers' generate() on PyTorch CPU, in one process.

    pip install -e '.[peer]'
    python -m benchmarks.peer --out benchmarks/peer.md            (from the repository root)
    python -m benchmarks.peer --requests 8 --max-prompt 256 --new-tokens 16   (a quick check)

The same weights (the built-in model exported as a LlamaForCausalLM folder), the same
prompt token ids, greedy decoding, end-of-sequence ignored; the peer runs generate() in
batches with left padding and an attention mask, which is what a user of transformers
would otherwise run. Both use the same number of CPU threads. Reports each side's output
throughput, their ratio, whether the greedy tokens match, and this engine's per-step
overhead outside the model forward.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import ServedRun, serve, synthetic_overrides
from benchmarks.report import machine_line, overhead_table, run_table, write_report
from stages.loading.checkpoint.export import export_hf_llama

# This engine's setting when none is given: its best on this workload (benchmarks/peer.md).
DEFAULT_SETTING = "max_num_seqs=64 max_tokens=2048"


def sorted_batches(
    prompts: list[list[int]], batch: int, pad_id: int
) -> Iterator[tuple[Any, Any, list[int]]]:
    """Left-padded (ids, mask, request indices) batches of `batch` prompts in length order,
    as a user of transformers would group them: each batch pads only to its own longest."""
    import torch

    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    for first in range(0, len(order), batch):
        group = order[first : first + batch]
        width = max(len(prompts[i]) for i in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, index in enumerate(group):
            prompt = prompts[index]
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        yield ids, mask, group


def peer_generate(
    folder: str | Path, prompts: list[list[int]], new_tokens: int, batch: int, pad_id: int
) -> tuple[list[list[int]], float]:
    """Greedy continuations from transformers, in request order; returns (ids, seconds of
    generation, model loading excluded)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return peer_generate_with(model, prompts, new_tokens, batch, pad_id)


def peer_generate_with(
    model: Any, prompts: list[list[int]], new_tokens: int, batch: int, pad_id: int
) -> tuple[list[list[int]], float]:
    """peer_generate on a loaded transformers model."""
    import torch

    # No end-of-sequence stop, like the engine's ignore_eos: every row runs to new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad_id
    outputs: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        # One short untimed call first: torch's first generate() pays one-off set-up costs.
        ids, mask, _ = next(sorted_batches(prompts[:batch], batch, pad_id))
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
    start = time.perf_counter()
    with torch.inference_mode():
        for ids, mask, group in sorted_batches(prompts, batch, pad_id):
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
            for index, row in zip(group, out[:, ids.shape[1] :].tolist(), strict=True):
                outputs[index] = row
    return outputs, time.perf_counter() - start


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(ours: ServedRun, peer_ids: list[list[int]]) -> dict:
    ordered = sorted(ours.requests, key=lambda r: r.index)
    diffs = [first_difference(r.output_ids, ids) for r, ids in zip(ordered, peer_ids, strict=True)]
    diverged = [d for d in diffs if d is not None]
    return {
        "matching": len(diffs) - len(diverged),
        "total": len(diffs),
        "first_divergence": sorted(diverged),
    }


@dataclass
class Round:
    first: str  # "this engine" or "peer"
    engine: dict[str, ServedRun]  # setting -> run
    peer: dict[int, tuple[list[list[int]], float]]  # batch size -> (ids, seconds)
    matches: list[dict]  # every engine run against every peer run
    load: float = 0.0  # the machine's 1-minute load average at the round's end

    def engine_rate(self, setting: str) -> float:
        return self.engine[setting].metrics["output_throughput"]

    def peer_rate(self, batch: int) -> float:
        ids, seconds = self.peer[batch]
        return sum(map(len, ids)) / seconds

    @property
    def best_engine(self) -> str:
        return max(self.engine, key=self.engine_rate)

    @property
    def best_peer(self) -> int:
        return max(self.peer, key=self.peer_rate)

    @property
    def ratio(self) -> float:
        return self.engine_rate(self.best_engine) / self.peer_rate(self.best_peer)

    @property
    def worst_match(self) -> dict:
        return min(self.matches, key=lambda m: m["matching"])


def run_rounds(args: argparse.Namespace, base: list[str], folder: str) -> list[Round]:
    """Every engine setting and every peer batch size once per round; odd rounds start
    with the peer. The first round serves this engine first: its weights and prompts
    (seeded, so the same every round) are exported for the peer."""
    rounds: list[Round] = []
    prompts: list[list[int]] = []
    pad = 0
    for index in range(args.rounds):
        current = Round("peer" if index % 2 else "this engine", {}, {}, [])
        for side in ("peer", "engine") if index % 2 else ("engine", "peer"):
            if side == "peer":
                for batch in args.peer_batches:
                    current.peer[batch] = peer_generate(
                        folder, prompts, args.new_tokens, batch, pad
                    )
                continue
            for setting in args.settings:
                run = serve([*base, *setting.split()])
                current.engine[setting] = run
                if not prompts:
                    export_hf_llama(run.extra["engine"].model, folder)
                    prompts = [r.prompt_ids for r in sorted(run.requests, key=lambda r: r.index)]
                    pad = run.extra["engine"].tokenizer.pad_id
        current.matches = [
            compare(run, ids) for run in current.engine.values() for ids, _ in current.peer.values()
        ]
        current.load = os.getloadavg()[0]
        rounds.append(current)
        print(
            f"round {index + 1}: "
            + ", ".join(f"[{s}] {current.engine_rate(s):.1f}" for s in args.settings)
            + " | peer "
            + ", ".join(f"batch {b} {current.peer_rate(b):.1f}" for b in args.peer_batches)
            + f" tok/s | ratio {current.ratio:.2f}x, tokens "
            f"{current.worst_match['matching']}/{current.worst_match['total']}",
            flush=True,
        )
    return rounds


def report(args: argparse.Namespace, rounds: list[Round]) -> list[str]:
    import torch

    settings, batches = args.settings, args.peer_batches
    header = [f"this engine [{s or 'defaults'}]" for s in settings] + [
        f"peer batch {b}" for b in batches
    ]
    rows = []
    for index, r in enumerate(rounds):
        cells = [f"{r.engine_rate(s):.1f}" for s in settings]
        cells += [f"{r.peer_rate(b):.1f}" for b in batches]
        match = r.worst_match
        rows.append(
            f"| {index + 1} | {r.first} | "
            + " | ".join(cells)
            + f" | {r.ratio:.2f}x | {match['matching']}/{match['total']} | {r.load:.1f} |"
        )
    ratios = [r.ratio for r in rounds]
    engine_medians = {s: float(np.median([r.engine_rate(s) for r in rounds])) for s in settings}
    peer_medians = {b: float(np.median([r.peer_rate(b) for r in rounds])) for b in batches}
    best_setting = max(engine_medians, key=engine_medians.get)
    best_batch = max(peer_medians, key=peer_medians.get)
    worst = min((r.worst_match for r in rounds), key=lambda m: m["matching"])
    last = rounds[-1].engine[best_setting]
    return [
        f"## model={args.model}",
        "",
        f"{args.requests} requests, prompts {args.min_prompt}-{args.max_prompt} tokens, "
        f"{args.new_tokens} new tokens each, greedy, {args.threads} threads on both sides, "
        f"one process; peer: transformers {_version('transformers')} on torch "
        f"{torch.__version__}, prompts sorted by length, left-padded batches of "
        f"{', '.join(map(str, batches))}. tok/s = output tokens over wall time.",
        "",
        machine_line(rounds[0].engine[settings[0]].matmul_rate, args.threads),
        "",
        "| round | first | " + " | ".join(header) + " | best / best | tokens identical | load |",
        "| ---: | --- | " + " | ".join("---:" for _ in header) + " | ---: | ---: | ---: |",
        *rows,
        "",
        f"Output throughput ratio, this engine's best setting over the peer's best batch "
        f"size in each round, median over {len(rounds)} rounds: "
        f"**{float(np.median(ratios)):.2f}x** (rounds: "
        + ", ".join(f"{x:.2f}x" for x in ratios)
        + f"). Medians: this engine's best setting [{best_setting or 'defaults'}] "
        f"{engine_medians[best_setting]:.1f} tok/s, the peer's best batch size {best_batch} "
        f"{peer_medians[best_batch]:.1f} tok/s.",
        f"Greedy tokens identical for {worst['matching']}/{worst['total']} requests in every "
        "round, every engine setting against every peer batch size"
        + (
            f"; the others first differ at output positions {worst['first_divergence']}."
            if worst["first_divergence"]
            else "."
        ),
        f"load = the machine's 1-minute load average at the end of the round, on "
        f"{os.cpu_count()} cores: other work on a shared machine slows both sides, and the "
        "peer's many small two-thread operators the more.",
        "",
        f"### This engine's last run [{best_setting or 'defaults'}]",
        "",
        *run_table([("peer workload", last)]),
        "",
        *overhead_table(last),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=["tiny", "small"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--peer-batches",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[8, 16, 32, 64],
        help="generate() batch sizes, comma-separated; the best one is the denominator",
    )
    parser.add_argument(
        "--setting",
        dest="settings",
        action="append",
        help="this engine's overrides, space-separated; repeat to try several (the best "
        f"one counts); default: {DEFAULT_SETTING!r}",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating which goes first")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args()
    args.settings = args.settings or [DEFAULT_SETTING]
    if args.rounds < 1 or not args.peer_batches or min(args.peer_batches) < 1:
        parser.error("--rounds and every --peer-batches size must be at least 1")

    import torch

    torch.set_num_threads(args.threads)
    base = [
        *synthetic_overrides(
            args.requests, args.min_prompt, args.max_prompt, args.new_tokens, args.threads
        ),
        f"model={args.model}",
    ]
    with tempfile.TemporaryDirectory() as folder:
        rounds = run_rounds(args, base, folder)
    text = "\n".join(report(args, rounds)) + "\n"
    print(text)
    if args.out:
        write_report(args.out, text)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
