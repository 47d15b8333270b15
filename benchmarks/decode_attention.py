"""Why the CPU decode attention sits above its memory floor.

    python -m benchmarks.decode_attention --batch 32 --context 512   (from the repository root)
    python -m benchmarks.decode_attention --model tiny --batch 64 --context 640

Three figures per layer, on the decode-step benchmark's shapes (benchmarks/decode_step.py):
the decode op as the forward calls it (every layer's op timed inside real forwards; it ends
with the output projection, a [batch, hidden] @ [hidden, hidden] matmul), the op's two
batched matmuls alone (scores: each block's queries by its transposed keys; weighted
values: each block's probabilities by its values), and plain sums of the same caches (keys
and values), the read floor. Each is taken over one cache per layer, so that the caches do
not stay in the L3 between calls as one cache would. The scores' matmul is also timed with
the keys stored untransposed ([block_size, head_dim] a block, multiplied with transpose_y),
the layout the CPU backend does not use.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pipeline  # noqa: F401  # isort: skip  (chooses MKL's code path before Paddle loads it)
import paddle  # isort: skip

from benchmarks.decode_step import decode_engine, decode_plan
from pipeline.calibrate import timed_calls


def per_layer_ms(fn, layers: int, repeats: int) -> tuple[float, float]:
    """(best, median) ms per layer of fn(), which covers every layer once."""
    times = np.array(timed_calls(fn, repeats, warm=3)) * 1e3 / layers
    return float(times.min()), float(np.median(times))


def forward_decode_ms(engine, meta, repeats: int) -> tuple[float, float]:
    """The decode op's time per layer inside real forwards: (best, median) over forwards."""
    ops = engine.attention.ops
    decode, spent = ops.decode, []

    def timed_decode(*args, **kwargs):
        start = time.perf_counter()
        out = decode(*args, **kwargs)
        spent[-1] += time.perf_counter() - start
        return out

    ops.decode = timed_decode
    try:
        for _ in range(repeats + 3):
            spent.append(0.0)
            engine.model.forward(meta, engine.attention)
    finally:
        ops.decode = decode
    layers = len(engine.attention.k_cache)
    times = np.array(spent[3:]) * 1e3 / layers
    return float(times.min()), float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="small", choices=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    engine = decode_engine(args.model, args.threads, args.batch, args.context)
    meta = engine.metadata.build(decode_plan(engine, args.batch, args.context))
    k_caches, v_caches = engine.attention.k_cache, engine.attention.v_cache
    layers = len(k_caches)
    nb, kv, d, bs = k_caches[0].shape
    g = engine.attention.heads.num_heads // kv
    queries = paddle.randn([nb, kv, g, d])
    probs = paddle.randn([nb, kv, g, bs])
    untransposed = [paddle.randn([nb, kv, bs, d]) for _ in range(layers)]
    cache_mb = k_caches[0].numel().item() * k_caches[0].element_size() / 1e6

    rows = [
        ("the decode op, in the forward", forward_decode_ms(engine, meta, args.repeats)),
        (
            "scores: [G, D] @ keys [D, bs] a block",
            per_layer_ms(lambda: [paddle.matmul(queries, k) for k in k_caches], layers, 20),
        ),
        (
            "weighted values: [G, bs] @ values [bs, D] a block",
            per_layer_ms(lambda: [paddle.matmul(probs, v) for v in v_caches], layers, 20),
        ),
        (
            "scores, keys untransposed: [G, D] @ [bs, D]^T",
            per_layer_ms(
                lambda: [paddle.matmul(queries, k, transpose_y=True) for k in untransposed],
                layers,
                20,
            ),
        ),
        (
            "the read floor: sums of the keys and the values",
            per_layer_ms(
                lambda: [float(k.sum() + v.sum()) for k, v in zip(k_caches, v_caches, strict=True)],
                layers,
                20,
            ),
        ),
    ]
    print(
        f"decode attention, model={args.model}, batch {args.batch}, context {args.context}: "
        f"{nb} blocks of {bs}, {kv} KV heads of {d} dims, {g} queries each, a batch of "
        f"{nb * kv} products per matmul; one layer's keys {cache_mb:.1f} MB (values the same)"
    )
    for name, (best, median) in rows:
        print(f"  {name:52s} {best:7.3f} ms best, {median:7.3f} ms median, a layer")


if __name__ == "__main__":
    main()
