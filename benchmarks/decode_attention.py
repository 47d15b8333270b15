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
the layout the CPU backend does not use, and both matmuls with every KV head's queries
placed block-diagonally (a block's [H, KV * D] queries by its [KV * D, bs] keys, its
[H, KV * bs] probabilities by its [KV * bs, D] values: a KV-th of the products, KV times the
FLOPs), which the CPU backend does not use either.

`--block-sizes 64,128,256,512,1024` adds a sweep: the same layer's bytes cut into blocks of
each size, and for each the two batched matmuls' read rate (the cache bytes each reads over
its time) beside a plain sum's. Larger blocks mean fewer, larger products; the sweep shows
how far that alone brings the products to the read floor.
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


def block_size_sweep(
    kv: int, g: int, d: int, layer_bytes: float, layers: int, block_sizes: list[int]
) -> list[tuple[int, int, float, float, float]]:
    """(block size, blocks, scores GB/s, values GB/s, sum GB/s) for caches of `layer_bytes`
    a layer, random, one per layer so that the L3 holds none of them between calls."""
    rows = []
    for bs in block_sizes:
        nb = max(1, round(layer_bytes / (kv * d * bs * 4)))
        keys = [paddle.randn([nb, kv, d, bs]) for _ in range(layers)]
        values = [paddle.randn([nb, kv, bs, d]) for _ in range(layers)]
        queries, probs = paddle.randn([nb, kv, g, d]), paddle.randn([nb, kv, g, bs])
        gigabytes = nb * kv * d * bs * 4 / 1e9

        def rate(fn, gigabytes: float = gigabytes) -> float:
            best, _ = per_layer_ms(fn, layers, 10)
            return gigabytes / (best / 1e3)

        rows.append(
            (
                bs,
                nb,
                rate(lambda k=keys, q=queries: [paddle.matmul(q, x) for x in k]),
                rate(lambda v=values, p=probs: [paddle.matmul(p, x) for x in v]),
                rate(lambda k=keys: [float(x.sum()) for x in k]),
            )
        )
        del keys, values
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="small", choices=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--block-sizes", default="", help="comma-separated, e.g. 64,128,256")
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
    diagonal_queries = paddle.randn([nb, kv * g, kv * d])
    diagonal_probs = paddle.randn([nb, kv * g, kv * bs])
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
            "scores, block-diagonal: [H, KV*D] @ [KV*D, bs]",
            per_layer_ms(
                lambda: [
                    paddle.matmul(diagonal_queries, k.reshape([nb, kv * d, bs])) for k in k_caches
                ],
                layers,
                20,
            ),
        ),
        (
            "weighted values, block-diagonal: [H, KV*bs] @ [KV*bs, D]",
            per_layer_ms(
                lambda: [
                    paddle.matmul(diagonal_probs, v.reshape([nb, kv * bs, d])) for v in v_caches
                ],
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
        print(f"  {name:58s} {best:7.3f} ms best, {median:7.3f} ms median, a layer")
    if args.block_sizes:
        sizes = [int(x) for x in args.block_sizes.split(",")]
        print(f"the same {cache_mb:.1f} MB a layer in blocks of each size, read GB/s (best):")
        print("  block  blocks  scores matmul  values matmul  plain sum")
        for bs, blocks, scores, values, total in block_size_sweep(
            kv, g, d, cache_mb * 1e6, layers, sizes
        ):
            print(f"  {bs:5d}  {blocks:6d}  {scores:13.1f}  {values:13.1f}  {total:9.1f}")


if __name__ == "__main__":
    main()
