"""Per-token log-probabilities on a real GGUF against transformers reading the same file.

    python -m benchmarks.logprobs_reference SmolLM2-135M-Instruct.Q4_1.gguf [OVERRIDES...]

The engine (`model=gguf model.path=FILE`, float32 on CPU, OVERRIDES after) runs a few
prompts asking for their prompt's log-probabilities and each output token's (5 most likely
and the scored token, greedy, 8 outputs); transformers (the `peer` extra) reads the GGUF with
from_pretrained(gguf_file=...), dequantised to float32, and takes torch.log_softmax of its
logits on the same ids. Prints, per prompt, the values compared and the largest absolute
difference, and the largest over all; exit code 1 when it is above 1e-4.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.config.compose import compose_config
from pipeline.executors import build_engine
from stages.scheduling.request import Request, SamplingParams

PROMPTS = [
    "Question: What is 26 + 54?\nAnswer: 80\n\nQuestion: What is 17 times 3?\nAnswer:",
    "The quick brown fox jumps over the lazy dog. Paged attention keeps the KV cache",
    "How many centimetres are there in 7 metres?",
]
OUTPUTS = 8
TOLERANCE = 1e-4


def engine_logprobs(path: Path, overrides: list[str]) -> list[Request]:
    """The prompts run by the engine, each request holding its log-probabilities."""
    cfg = compose_config(["model=gguf", f"model.path={path}", "prefix_caching=false", *overrides])
    engine, _ = build_engine(cfg)
    asked = SamplingParams(logprobs=5, prompt_logprobs=5)
    requests = [
        Request(
            str(i), i, text, engine.tokenizer.encode(text), OUTPUTS, ignore_eos=True, sampling=asked
        )  # fmt: skip
        for i, text in enumerate(PROMPTS)
    ]
    engine.run(requests)
    return requests


def gaps(torch, model, request: Request) -> list[float]:
    """|engine - transformers| over every value each entry holds."""
    ids = [*request.prompt_ids, *request.output_ids]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    rows = torch.log_softmax(logits, dim=-1)
    entries = [*(request.prompt_logprobs or []), *request.logprobs]
    assert len(entries) == len(ids) - 1
    return [abs(value - float(rows[i, token])) for i, entry in enumerate(entries)
            for token, value in entry.items()]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.logprobs_reference",
                                     description=(__doc__ or "").split("\n\n")[0])  # fmt: skip
    parser.add_argument("gguf", type=Path)
    parser.add_argument("overrides", nargs="*", help="the engine's (max_model_len=...)")
    args = parser.parse_args(argv)
    import torch
    import transformers

    requests = engine_logprobs(args.gguf.resolve(), args.overrides)
    path = args.gguf.resolve()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    worst = 0.0
    for request in requests:
        found = gaps(torch, model, request)
        worst = max(worst, *found)
        print(f"prompt {request.id}: {len(request.prompt_ids)} prompt + {OUTPUTS} output "
              f"tokens, {len(found)} values, max |diff| {max(found):.2e}")  # fmt: skip
    print(f"max |engine - transformers| = {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
