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

That roofline assumes the step's compute-bound work (the dense layers' matmuls, at batch 64
and up) and its memory-bound work (the attention's reads of the cache) overlap perfectly.
A layer runs them one after the other, so the roofline by part is also given: the dense
layers at the larger of their FLOPs' and their weights' time, plus the attention at the
larger of its FLOPs' and its cache reads' time.

On a shared machine the forward, the matmul rate and the bandwidth drift together and apart
by tens of percent from one second to the next, so they are measured in turn, `--rounds`
times, and the forward / roofline ratio is given for each round: its median is the figure
to quote.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import numpy as np
import paddle

from benchmarks.floor import attention_flops, head_flops, matmul_rate, token_flops
from pipeline.calibrate import timed_calls
from pipeline.config.compose import compose_config
from pipeline.executors import build_engine
from stages.model.spec import ModelSpec
from stages.scheduling.request import Request, StepPlan


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
        engine.scheduler.kv_cache.allocate_slots(r, context, computed=0)  # blocks for every token
        requests.append(r)
    return StepPlan(decode=requests)


class Roofline(NamedTuple):
    """A decode step's least times in ms: the FLOP and memory floors of the whole step,
    and of its two kinds of work apart (the dense layers' matmuls over the weights; the
    attention over the cached keys and values)."""

    flop_ms: float
    memory_ms: float
    dense_ms: float
    attention_ms: float

    @property
    def whole_ms(self) -> float:
        """max(FLOP floor, memory floor): the step if its compute-bound and its memory-bound
        work overlapped perfectly."""
        return max(self.flop_ms, self.memory_ms)

    @property
    def by_part_ms(self) -> float:
        """Each part at its own floor, one after the other: a layer's attention needs its
        QKV and its output projection needs the attention, so the parts cannot overlap."""
        return self.dense_ms + self.attention_ms


def decode_roofline(
    dims: ModelSpec, weight_bytes: int, batch: int, context: int, rate: float, bandwidth: float
) -> Roofline:
    """The roofline of `batch` decodes at `context` tokens each, at `rate` FLOP/s and
    `bandwidth` bytes/s. Every cached key and value is read once a layer, and the weights
    once a step (at small batches they do not stay in cache)."""
    dense_flops = batch * (token_flops(dims) + head_flops(dims))
    kv_flops = attention_flops(dims, batch * context)
    kv_bytes = dims.num_layers * 2 * batch * context * dims.num_kv_heads * dims.head_dim * 4
    ms = 1e3
    return Roofline(
        flop_ms=(dense_flops + kv_flops) / rate * ms,
        memory_ms=(weight_bytes + kv_bytes) / bandwidth * ms,
        dense_ms=max(dense_flops / rate, weight_bytes / bandwidth) * ms,
        attention_ms=max(kv_flops / rate, kv_bytes / bandwidth) * ms,
    )


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
    dims, weight_bytes = engine.model.spec, engine.model.num_bytes

    def forward() -> float:
        return float(engine.model.forward(meta, engine.attention)[0, 0])

    # The forward, the matmul rate at the decode's row count and the read bandwidth in
    # turn: each round's forward is set against the floors measured beside it.
    forward_times, rooflines = [], []
    for _ in range(args.rounds):
        forward_times.append(timed_ms(forward, args.repeats))
        rate = matmul_rate(args.threads, dims, rows=(args.batch,))
        rooflines.append(
            decode_roofline(dims, weight_bytes, args.batch, args.context, rate, read_bandwidth())
        )
    forward_ms = min(best for best, _ in forward_times)
    forward_median = float(np.median([median for _, median in forward_times]))
    step_ms, step_median = timed_ms(
        lambda: float(engine.model.forward(engine.metadata.build(plan), engine.attention)[0, 0]),
        args.repeats,
    )
    kv_mib = dims.num_layers * 2 * args.batch * args.context * dims.num_kv_heads * dims.head_dim
    kv_mib = kv_mib * 4 / 2**20

    def per_round(values) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    def ratios(floor) -> str:
        values = [best / floor(r) for (best, _), r in zip(forward_times, rooflines, strict=True)]
        return f"{per_round(values)}x, median **{float(np.median(values)):.2f}x**"

    print(
        f"decode step, model={args.model}, batch {args.batch}, context {args.context}, "
        f"{meta.bucket}"
    )
    print(f"  forward            {forward_ms:8.2f} ms best, {forward_median:8.2f} ms median")
    print(f"  metadata + forward {step_ms:8.2f} ms best, {step_median:8.2f} ms median")
    print(f"  per round, ms: FLOP floor {per_round(r.flop_ms for r in rooflines)}")
    print(
        f"                 memory floor {per_round(r.memory_ms for r in rooflines)}: the KV "
        f"cache ({kv_mib:.0f} MiB) and the weights ({weight_bytes / 2**20:.0f} MiB) read once"
    )
    print(
        f"                 dense layers' floor {per_round(r.dense_ms for r in rooflines)}, "
        f"attention's floor {per_round(r.attention_ms for r in rooflines)}"
    )
    print(
        "  best forward / roofline, max(FLOP floor, memory floor), per round: "
        + ratios(lambda r: r.whole_ms)
    )
    print(
        "  best forward / roofline by part, dense layers' floor + attention's floor, "
        "per round: " + ratios(lambda r: r.by_part_ms)
    )


if __name__ == "__main__":
    main()
