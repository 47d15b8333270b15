"""This engine against Hugging Face transformers on a real GGUF file: the same chat prompts,
greedy, in one process.

    pip install -e '.[peer]'
    python -m benchmarks.peer_gguf --gguf /work/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out benchmarks/peer_gguf.md

Both sides read the file themselves: this engine with model=gguf (its own dequantisation,
tokenizer and chat template), transformers with from_pretrained(..., gguf_file=...) (its
own GGUF loading, dequantised to float32). The prompts are chat questions rendered by each
side's chat template; the report says whether the prompt ids agree (tokenizer and template
parity), then both generate `--new-tokens` greedy tokens per prompt from this engine's
ids, end-of-sequence ignored, and the greedy tokens are compared request by request.
Throughput: each side's output tokens over wall time, the peer at several batch sizes
(left-padded, sorted by length), the best of `--rounds` for each.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from benchmarks.harness import ServedRun, serve
from benchmarks.peer import compare, peer_generate_with
from benchmarks.report import machine_line, overhead_table, write_report

QUESTIONS = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Give me three tips for staying focused while studying.",
    "What does a compiler do?",
    "Explain photosynthesis to a ten-year-old.",
    "How many legs does a spider have?",
    "Write a haiku about autumn rain.",
    "What is the difference between weather and climate?",
    "Name the planets of the solar system in order.",
    "How do vaccines work?",
    "What is a prime number? Give two examples.",
    "Suggest a name for a friendly robot.",
    "Why do we need sleep?",
    "What is the boiling point of water at sea level?",
    "How does a bicycle stay upright?",
    "Summarise the story of Romeo and Juliet in two sentences.",
]


def chat_lines(count: int, new_tokens: int) -> list[dict]:
    return [
        {
            "id": f"q{i}",
            "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_new_tokens": new_tokens,
            "ignore_eos": True,
        }
        for i in range(count)
    ]


def tokenizer_parity(path: Path, lines: list[dict], ours: ServedRun) -> dict:
    """transformers' tokenizer from the same file, its chat template applied, against the
    engine's prompt ids; and plain texts encoded by both."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    engine = ours.extra["engine"]
    ordered = sorted(ours.requests, key=lambda r: r.index)
    chats = 0
    for line, request in zip(lines, ordered, strict=True):
        ids = theirs.apply_chat_template(line["messages"], add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids  # a BatchEncoding
        chats += list(ids) == request.prompt_ids
    texts = [*QUESTIONS, "Numbers 12345 and  two  spaces\nnew line, émigré, 東京, 🙂."]
    plain = sum(
        theirs.encode(t, add_special_tokens=False) == engine.tokenizer.encode(t) for t in texts
    )
    return {"chat": (chats, len(lines)), "plain": (plain, len(texts))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="a GGUF file (llama family)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-batches", default="4,16", help="generate() batch sizes")
    parser.add_argument("--setting", default="max_num_seqs=16 max_tokens=2048")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args()
    batches = [int(b) for b in args.peer_batches.split(",")]

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    lines = chat_lines(args.requests, args.new_tokens)
    with tempfile.TemporaryDirectory() as folder:
        jsonl = Path(folder) / "chat.jsonl"
        jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
        overrides = [
            "model=gguf",
            f"model.path={args.gguf}",
            "workload=jsonl",
            f"workload.path={jsonl}",
            f"num_threads={args.threads}",
            "max_model_len=1024",
            *args.setting.split(),
        ]
        peer = AutoModelForCausalLM.from_pretrained(
            str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32
        ).eval()
        ours_rates, peer_rates, matches = [], {b: [] for b in batches}, []
        for _ in range(args.rounds):
            run = serve(overrides)
            ours_rates.append(run.metrics["output_throughput"])
            prompts = [r.prompt_ids for r in sorted(run.requests, key=lambda r: r.index)]
            pad = run.extra["engine"].tokenizer.pad_id
            for batch in batches:
                ids, seconds = peer_generate_with(peer, prompts, args.new_tokens, batch, pad)
                peer_rates[batch].append(sum(map(len, ids)) / seconds)
                matches.append(compare(run, ids))
            peer_now = ", ".join(f"batch {b} {peer_rates[b][-1]:.1f}" for b in batches)
            print(f"this engine {ours_rates[-1]:.1f} tok/s; peer {peer_now} tok/s", flush=True)
        parity = tokenizer_parity(args.gguf, lines, run)
    text = "\n".join(report(args, batches, ours_rates, peer_rates, matches, parity))
    text += "\n\n" + machine_line(run.matmul_rate, args.threads) + "\n\n"
    text += "\n".join(overhead_table(run)) + "\n"
    print(text)
    if args.out:
        write_report(args.out, text)


def report(args, batches, ours_rates, peer_rates, matches, parity) -> list[str]:
    import torch
    import transformers

    best_peer = max(batches, key=lambda b: max(peer_rates[b]))
    worst = min(matches, key=lambda m: m["matching"])
    ours, theirs = max(ours_rates), max(peer_rates[best_peer])
    return [
        f"## {args.gguf.name}",
        "",
        f"{args.requests} chat questions, {args.new_tokens} new tokens each, greedy, EOS "
        f"ignored, {args.threads} threads on both sides, one process, {os.cpu_count()} cores "
        f"(shared machine: load {os.getloadavg()[0]:.1f} at the end). Peer: transformers "
        f"{transformers.__version__} on torch {torch.__version__}, from_pretrained(gguf_file=), "
        f"float32. This engine: model=gguf [{args.setting}], float32.",
        "",
        "| side | best tok/s | rounds |",
        "| --- | ---: | --- |",
        f"| this engine | {ours:.1f} | {', '.join(f'{x:.1f}' for x in ours_rates)} |",
        *(
            f"| transformers batch {b} | {max(peer_rates[b]):.1f} | "
            f"{', '.join(f'{x:.1f}' for x in peer_rates[b])} |"
            for b in batches
        ),
        "",
        f"Best over best: **{ours / theirs:.2f}x** (median of rounds "
        f"{float(np.median(ours_rates)) / float(np.median(peer_rates[best_peer])):.2f}x).",
        f"Greedy tokens identical for {worst['matching']}/{worst['total']} requests in the "
        "worst comparison"
        + (
            f"; the others first differ at {worst['first_divergence']}."
            if worst["first_divergence"]
            else "."
        )
        + f" Prompt ids equal to transformers' tokenizer with its chat template: "
        f"{parity['chat'][0]}/{parity['chat'][1]}; plain texts encoded alike: "
        f"{parity['plain'][0]}/{parity['plain'][1]}.",
    ]


if __name__ == "__main__":
    main()
