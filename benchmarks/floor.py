"""The machine's floor: a run's model FLOPs over the rate Paddle's matmul reaches here.

    python benchmarks/floor.py --threads 2

Every benchmark figure can then be read as a fraction of that limit: a run that takes
`floor_s / duration_s` = 0.4 spends 60% of its time on something other than the minimum
matmul work (attention layout, padding, elementwise ops, engine bookkeeping).

FLOPs count 2 per multiply-add: the projections (QKV, output), the SwiGLU MLP, the lm head
on rows whose logits are used, and attention's QK and PV over each query's causal context.
Norms, rotary, softmax and the embedding gather are left out: they are a few percent.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

import pipeline  # noqa: F401  # isort: skip  (chooses MKL's code path before Paddle loads it)
import paddle  # isort: skip

from pipeline.executors.allocator import keep_freed_memory
from stages.model.spec import ModelSpec

# conf/model/small.yaml, the model the benchmarks run.
SMALL_DIMS = ModelSpec(
    vocab_size=259,
    hidden_size=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=1408,
)


def token_flops(dims: ModelSpec) -> int:
    """FLOPs of one token through every layer's projections and MLP (no attention, no head)."""
    h, d = dims.hidden_size, dims.head_dim
    qkv = h * (dims.num_heads + 2 * dims.num_kv_heads) * d
    out = dims.num_heads * d * h
    mlp = 3 * h * dims.intermediate_size  # gate, up and down
    return 2 * dims.num_layers * (qkv + out + mlp)


def head_flops(dims: ModelSpec) -> int:
    """FLOPs of one row through the lm head."""
    return 2 * dims.hidden_size * dims.vocab_size


def attention_flops(dims: ModelSpec, keys: int) -> int:
    """FLOPs of QK and PV for `keys` query-key pairs, summed over every layer and head."""
    return 2 * 2 * dims.num_layers * dims.num_heads * dims.head_dim * keys


def causal_keys(new_tokens: int, context_len: int) -> int:
    """Query-key pairs of `new_tokens` queries ending at `context_len`, each seeing its past."""
    start = context_len - new_tokens
    return new_tokens * start + new_tokens * (new_tokens + 1) // 2


def step_flops(dims: ModelSpec, tokens: int | Sequence[int], context_lens: Sequence[int]) -> int:
    """FLOPs of one engine step.

    Each row (a prefill chunk or a decode) computes `tokens[i]` new tokens and ends at
    `context_lens[i]` tokens in its sequence, the new ones included; a decode is
    tokens=1, context=length. An int `tokens` applies to every row. Each row has one
    logits row through the lm head."""
    if isinstance(tokens, int):
        tokens = [tokens] * len(context_lens)
    if len(tokens) != len(context_lens):
        raise ValueError("tokens and context_lens need one entry per row")
    if any(not 1 <= t <= c for t, c in zip(tokens, context_lens, strict=True)):
        raise ValueError("each row needs 1 <= tokens <= context_lens")
    keys = sum(causal_keys(t, c) for t, c in zip(tokens, context_lens, strict=True))
    return (
        sum(tokens) * token_flops(dims)
        + len(tokens) * head_flops(dims)
        + attention_flops(dims, keys)
    )


def run_flops(dims: ModelSpec, prompt_lens: Sequence[int], output_lens: Sequence[int]) -> int:
    """The least FLOPs that serve every request: each prompt prefilled once, then one decode
    per output token after the first (which the prefill's last row yields).

    Independent of scheduling, so chunking, padding and preemption show up as time over
    the floor, not as a different floor."""
    total = 0
    for prompt, output in zip(prompt_lens, output_lens, strict=True):
        if output < 1:
            continue
        length = prompt + output - 1  # the last output token is never fed back
        total += length * token_flops(dims) + output * head_flops(dims)
        total += attention_flops(dims, causal_keys(length, length))
    return total


def projection_shapes(dims: ModelSpec, rows: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of each projection matmul for `rows` tokens."""
    h, d = dims.hidden_size, dims.head_dim
    return [
        (rows, h, (dims.num_heads + 2 * dims.num_kv_heads) * d),
        (rows, dims.num_heads * d, h),
        (rows, h, 2 * dims.intermediate_size),
        (rows, dims.intermediate_size, h),
    ]


def matmul_rate(
    num_threads: int,
    dims: ModelSpec = SMALL_DIMS,
    rows: Sequence[int] = (64, 256, 1024),
    repeats: int = 15,
    warmup: int = 3,
) -> float:
    """FLOP/s of paddle.matmul in fp32 on the model's projection shapes.

    For each row count, one pass over the four projection shapes is timed `repeats` times
    after `warmup` passes; the rate is that pass's FLOPs over its median time. The best
    row count's rate is returned: the floor is what the machine can do at its fastest.
    The allocator keeps freed memory, as the pipeline runs, so no page faults are timed."""
    keep_freed_memory()
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(num_threads)
    rng = np.random.default_rng(0)
    best = 0.0
    for m in rows:
        pairs = [
            (
                paddle.to_tensor(rng.standard_normal((m_, k)).astype("float32")),
                paddle.to_tensor(rng.standard_normal((k, n)).astype("float32")),
            )
            for m_, k, n in projection_shapes(dims, m)
        ]
        flops = sum(2 * m_ * k * n for m_, k, n in projection_shapes(dims, m))
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            for a, b in pairs:
                out = paddle.matmul(a, b)
            float(out[0, 0])  # wait for the result
            if i >= warmup:
                times.append(time.perf_counter() - start)
        best = max(best, flops / float(np.median(times)))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for m in (64, 256, 1024):
        rate = matmul_rate(args.threads, rows=(m,))
        print(f"rows={m:5d}: {rate / 1e9:7.1f} GFLOP/s")
    print(f"small model: {token_flops(SMALL_DIMS) / 1e6:.1f} MFLOP per token (no attention)")


if __name__ == "__main__":
    main()
