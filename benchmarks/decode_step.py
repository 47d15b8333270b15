"""One decode step against its roofline.

    python -m benchmarks.decode_step --batch 32 --context 512   (from the repository root)
    python -m benchmarks.decode_step --model tiny --batch 64 --context 640

Builds the real pipeline (Hydra compose, paged attention, HPU metadata), gives `batch`
requests a filled cache of `context` tokens each, and times the model forward of one decode
step (metadata built once, outside the timing) and the whole step including the metadata
build. The roofline is the larger of two floors: the FLOP floor, the step's FLOPs over the
Paddle matmul rate measured in the same run at the decode's own row count, and the memory
floor, the cached keys and values of every layer and the weights read once at the read
bandwidth measured in the same run. A decode at batch 32, context 512 reads far more bytes
than its FLOPs take time: it is memory-bound, and the FLOP floor alone would flatter it.

On a shared machine the forward, the matmul rate and the bandwidth drift together and apart
by tens of percent from one second to the next, so they are measured in turn, `--rounds`
times, and the forward / roofline ratio is given for each round: its median is the figure
to quote.
"""

from __future__ import annotations

import argparse

import numpy as np
import paddle

from benchmarks.floor import matmul_rate, step_flops
from pipeline.build import build_engine
from pipeline.calibrate import timed_calls
from pipeline.compose import compose_config
from stages.request import Request, StepPlan


def decode_engine(model: str, threads: int, batch: int, context: int, overrides=()):
    """An engine with just the KV blocks a decode of `batch` rows of `context` tokens needs
    (at the block size the overrides give)."""
    base = [f"model={model}", f"num_threads={threads}", f"max_num_seqs={batch}", *overrides]
    block_size = compose_config(base).block_size
    blocks = batch * -(-(context + 1) // block_size)
    return build_engine(compose_config([*base, f"num_blocks={blocks}"]))[0]


def decode_plan(engine, batch: int, context: int) -> StepPlan:
    """`batch` running requests whose first `context - 1` tokens are already cached."""
    rng = np.random.default_rng(0)
    requests = []
    for i in range(batch):
        ids = rng.integers(0, 256, context).tolist()
        r = Request(id=f"r{i}", index=i, prompt="", prompt_ids=ids[:-1], max_new_tokens=2)
        r.output_ids = ids[-1:]
        engine.scheduler.kv_cache.allocate_slots(r, context)  # blocks for every token
        r.num_computed = context - 1
        requests.append(r)
    return StepPlan(decode=requests)


def read_bandwidth(megabytes: int = 256, repeats: int = 10) -> float:
    """Bytes/s Paddle reads summing a tensor far larger than the caches."""
    x = paddle.ones([megabytes * 2**20 // 4], dtype="float32")
    best, _ = timed_ms(lambda: float(x.sum()), repeats)
    return x.shape[0] * 4 / (best / 1e3)


def timed_ms(fn, repeats: int) -> tuple[float, float]:
    """(best, median) of `repeats` calls after five warm ones (first calls pay for Paddle's
    allocations). The best is the figure other processes on a shared machine disturb least."""
    times = timed_calls(fn, repeats, warm=5)
    return float(np.min(times)) * 1e3, float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="small", choices=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5, help="forward and floor in turn")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    engine = decode_engine(args.model, args.threads, args.batch, args.context, args.overrides)
    plan = decode_plan(engine, args.batch, args.context)
    meta = engine.metadata.build(plan)
    flops = step_flops(engine.model.dims, 1, [args.context] * args.batch)

    def forward() -> float:
        return float(engine.model.forward(meta, engine.attention)[0, 0])

    forward_times, floor_times = [], []
    for _ in range(args.rounds):
        forward_times.append(timed_ms(forward, args.repeats))
        rate = matmul_rate(args.threads, engine.model.dims, rows=(args.batch,))
        floor_times.append(flops / rate * 1e3)
    forward_ms = min(best for best, _ in forward_times)
    forward_median = float(np.median([median for _, median in forward_times]))
    step_ms, step_median = timed_ms(
        lambda: float(engine.model.forward(engine.metadata.build(plan), engine.attention)[0, 0]),
        args.repeats,
    )
    rate_best = matmul_rate(args.threads, engine.model.dims)
    dims = engine.model.dims
    # Every cached key and value is read at least once per layer: decode's memory floor.
    kv_bytes = 2 * args.batch * args.context * dims.num_kv_heads * dims.head_dim * 4
    # The weights are read once a step too: at small batches they do not stay in cache.
    memory_bytes = dims.num_layers * kv_bytes + engine.model.num_bytes
    bandwidths = []
    roofline_ratios = []
    for (best, _), floor in zip(forward_times, floor_times, strict=True):
        bandwidths.append(read_bandwidth())
        roofline_ratios.append(best / max(floor, memory_bytes / bandwidths[-1] * 1e3))
    bandwidth = max(bandwidths)
    memory_ms = memory_bytes / bandwidth * 1e3
    roofline_ms = max(float(np.median(floor_times)), memory_ms)
    print(
        f"decode step, model={args.model}, batch {args.batch}, context {args.context}, "
        f"{meta.bucket}"
    )
    print(f"  forward            {forward_ms:8.2f} ms best, {forward_median:8.2f} ms median")
    print(f"  metadata + forward {step_ms:8.2f} ms best, {step_median:8.2f} ms median")
    print(f"  step FLOPs         {flops / 1e9:8.3f} GFLOP")
    print(
        "  FLOP floor at this row count, per round: "
        + ", ".join(f"{floor:.2f}" for floor in floor_times)
        + " ms"
    )
    best_floor_ms = flops / rate_best * 1e3
    print(
        f"  FLOP floor at the best row count {best_floor_ms:6.2f} ms "
        f"({rate_best / 1e9:.1f} GFLOP/s)"
    )
    print(
        f"  memory floor       {memory_ms:8.2f} ms: the KV cache "
        f"({dims.num_layers * kv_bytes / 2**20:.0f} MiB) and the weights "
        f"({engine.model.num_bytes / 2**20:.0f} MiB) read once at {bandwidth / 1e9:.1f} GB/s, "
        "the best read bandwidth measured here"
    )
    bound = "memory" if memory_ms >= float(np.median(floor_times)) else "FLOP"
    print(
        f"  roofline = max(FLOP floor, memory floor) = {roofline_ms:.2f} ms ({bound}-bound); "
        "best forward / roofline per round: "
        + ", ".join(f"{ratio:.2f}x" for ratio in roofline_ratios)
        + f", median **{float(np.median(roofline_ratios)):.2f}x**"
    )


if __name__ == "__main__":
    main()
