"""How far `model.weights=int8` moves a GGUF model's log-probabilities from float32's.

    python -m benchmarks.weight_drift FILE.gguf [--prompts 8 --new-tokens 32]

float32 generates `--new-tokens` greedy tokens for each chat prompt; then each storage
scores that same text (prompt_logprobs: every continuation token's log-probability given
the float32 text before it), so the two are compared token for token, teacher-forced; and
int8 generates freely, to count the greedy tokens it shares with float32 before the first
difference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.peer_gguf import chat_lines
from pipeline.config.compose import compose_config
from pipeline.executors import build_engine
from stages.scheduling.request import Request, SamplingParams


def engine_for(gguf: Path, weights: str, jsonl: Path, count: int):
    cfg = compose_config(
        [
            "model=gguf",
            f"model.path={gguf}",
            f"model.weights={weights}",
            "workload=jsonl",
            f"workload.path={jsonl}",
            f"max_num_seqs={count}",
            "max_model_len=1024",
        ]
    )
    return build_engine(cfg)


def scored(engine, texts: list[list[int]], starts: list[int]) -> list[np.ndarray]:
    """Each text's tokens from `starts[i]` on, scored given the tokens before them."""
    requests = [
        Request(
            id=f"s{i}",
            index=i,
            prompt="",
            prompt_ids=ids,
            max_new_tokens=1,
            sampling=SamplingParams(prompt_logprobs=0),
        )
        for i, ids in enumerate(texts)
    ]
    engine.run(requests)
    out = []
    for r, start in zip(requests, starts, strict=True):
        # entry i scores prompt token i + 1
        entries = r.prompt_logprobs[start - 1 :]
        ids = r.prompt_ids[start:]
        out.append(np.array([e[t] for e, t in zip(entries, ids, strict=True)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        jsonl = Path(folder) / "chat.jsonl"
        lines = chat_lines(args.prompts, args.new_tokens)
        jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
        exact, requests = engine_for(args.gguf, "float32", jsonl, args.prompts)
        exact.run(requests)
        requests.sort(key=lambda r: r.index)
        texts = [list(r.prompt_ids) + r.output_ids for r in requests]
        starts = [len(r.prompt_ids) for r in requests]
        reference = scored(exact, texts, starts)
        del exact
        lighter, free = engine_for(args.gguf, "int8", jsonl, args.prompts)
        drift = np.concatenate(
            [a - b for a, b in zip(scored(lighter, texts, starts), reference, strict=True)]
        )
        lighter.run(free)
    free.sort(key=lambda r: r.index)
    shared = [
        next(
            (i for i, (a, b) in enumerate(zip(f.output_ids, r.output_ids, strict=True)) if a != b),
            len(f.output_ids),
        )
        for f, r in zip(free, requests, strict=True)
    ]
    print(
        f"{args.gguf.name}, {args.prompts} chat prompts x {args.new_tokens} float32 greedy "
        f"tokens, teacher-forced: int8 - float32 log-probability of each token: mean "
        f"{drift.mean():+.4f}, mean |.| {np.abs(drift).mean():.4f}, max |.| "
        f"{np.abs(drift).max():.4f} nats over {drift.size} tokens; free-running int8 greedy "
        f"tokens shared with float32 before the first difference: {', '.join(map(str, shared))}"
        f" of {args.new_tokens}."
    )


if __name__ == "__main__":
    main()
