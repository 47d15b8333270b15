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
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import ServedRun, serve, synthetic_overrides
from benchmarks.report import machine_line, overhead_table, run_table, write_report
from stages.checkpoint import export_hf_llama


def peer_generate(
    folder: str | Path, prompts: list[list[int]], new_tokens: int, batch: int, pad_id: int
) -> tuple[list[list[int]], float]:
    """Greedy continuations from transformers (left-padded batches); returns (ids, seconds)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # No end-of-sequence stop, like the engine's ignore_eos: every row runs to new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad_id
    outputs: list[list[int]] = []
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(prompts), batch):
            group = prompts[first : first + batch]
            width = max(map(len, group))
            ids = torch.full((len(group), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for row, prompt in enumerate(group):
                ids[row, width - len(prompt) :] = torch.tensor(prompt)
                mask[row, width - len(prompt) :] = 1
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
            outputs.extend(out[:, width:].tolist())
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-batch", type=int, default=64, help="rows per generate() call")
    parser.add_argument("--rounds", type=int, default=2, help="alternating which goes first")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("overrides", nargs="*", help="pipeline overrides, e.g. max_tokens=1024")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    overrides = [
        *synthetic_overrides(
            args.requests, args.min_prompt, args.max_prompt, args.new_tokens, args.threads
        ),
        "max_tokens=2048",
        *args.overrides,
    ]
    rounds = []  # (this engine's run, peer seconds, token match), alternating who goes first
    prompts: list[list[int]] = []  # set by the first round, which serves this engine first
    pad = 0
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.rounds):
            if index % 2:
                peer_ids, peer_s = peer_generate(
                    folder, prompts, args.new_tokens, args.peer_batch, pad
                )
            ours = serve(overrides)
            if index == 0:  # the weights and prompts are seeded: the same every round
                engine = ours.extra["engine"]
                export_hf_llama(engine.model, folder)
                prompts = [r.prompt_ids for r in sorted(ours.requests, key=lambda r: r.index)]
                pad = engine.tokenizer.pad_id
            if index % 2 == 0:
                peer_ids, peer_s = peer_generate(
                    folder, prompts, args.new_tokens, args.peer_batch, pad
                )
            rounds.append((ours, peer_s, compare(ours, peer_ids)))
            print(
                f"round {index + 1}: this engine {ours.metrics['output_throughput']:.1f} tok/s, "
                f"peer {sum(map(len, peer_ids)) / peer_s:.1f} tok/s",
                flush=True,
            )
    match = min((m for _, _, m in rounds), key=lambda m: m["matching"])  # the worst round
    peer_tokens = sum(map(len, peer_ids))
    ratios = [run.metrics["output_throughput"] / (peer_tokens / secs) for run, secs, _ in rounds]
    rows = []
    for index, (run, secs, _) in enumerate(rounds):
        rows.append(
            f"| {index + 1} | {'this engine' if index % 2 == 0 else 'peer'} | "
            f"{run.metrics['output_throughput']:.1f} | {run.metrics['duration_s']:.2f} | "
            f"{run.floor_fraction:.3f} | {peer_tokens / secs:.1f} | {secs:.2f} | "
            f"{run.floor_s / secs:.3f} | {ratios[index]:.2f}x |"
        )
    lines = [
        "# This engine against transformers generate()",
        "",
        f"{args.requests} requests, prompts {args.min_prompt}-{args.max_prompt} tokens, "
        f"{args.new_tokens} new tokens each, model=small, greedy, {args.threads} threads on "
        f"both sides, one process; peer: transformers {_version('transformers')} on torch "
        f"{torch.__version__}, batches of {args.peer_batch} with left padding.",
        "",
        machine_line(rounds[0][0].matmul_rate, args.threads),
        "",
        "| round | first | this engine tok/s | wall s | floor / wall | peer tok/s | wall s "
        "| floor / wall | ratio |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Output throughput ratio (this engine / peer), median over rounds: "
        f"**{float(np.median(ratios)):.2f}x**.",
        f"Greedy tokens identical for {match['matching']}/{match['total']} requests"
        + (" in every round" if args.rounds > 1 else "")
        + (
            f"; the others first differ at output positions {match['first_divergence']}."
            if match["first_divergence"]
            else "."
        ),
        "",
        "## This engine's last run",
        "",
        *run_table([("peer workload", ours)]),
        "",
        *overhead_table(ours),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_report(args.out, text)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
