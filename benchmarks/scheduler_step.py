"""Cost of scheduling one step with many running and many waiting requests.

    python benchmarks/scheduler_step.py --running 256 --waiting 10000

The cost should follow the running set, not the waiting queue: admission stops at the
first waiting request that cannot be admitted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.schema import ChunkedSchedulerConf
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request, Samples
from stages.scheduling.scheduler import ChunkedScheduler
from stages.scheduling.stopping import StopRule

# The scheduler's knobs as the config gives them by default (pipeline/schema/stages.py).
_CONF = ChunkedSchedulerConf()
SCHEDULER_DEFAULTS = {
    "align_chunks": _CONF.align_chunks,
    "long_prefill_threshold": _CONF.long_prefill_threshold,
    "budget": _CONF.budget,
    "max_padding": _CONF.max_padding,
    "no_evict": _CONF.no_evict,
    "max_prefill_rows": _CONF.max_prefill_rows,
    "step_order": "decode_first",  # the native engine's (its config's is the engine's)
}


def make_scheduler(running: int, waiting: int) -> ChunkedScheduler:
    sched = ChunkedScheduler(
        kv_cache=KVCacheManager(num_blocks=running * 32 + 64, block_size=128),
        stop=StopRule((), max_model_len=4096),
        max_tokens=8192,
        max_num_seqs=running,
        max_model_len=4096,
        **SCHEDULER_DEFAULTS,
    )
    for i in range(running + waiting):
        sched.add(Request(f"r{i}", i, "x", [1] * 100, max_new_tokens=1_000_000))
    # Fill the running set and move everyone to decode.
    while len(sched.running) < running:
        plan = sched.schedule()
        sched.update(plan, Samples(np.full(len(plan.sampled_requests), 7)), 0.0)
    return sched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    for waiting in (0, args.waiting):
        sched = make_scheduler(args.running, waiting)
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            plan = sched.schedule()
            times.append(time.perf_counter() - t)
            sched.update(plan, Samples(np.full(len(plan.sampled_requests), 7)), 0.0)
        times.sort()
        print(
            f"running={len(sched.running)} waiting={len(sched.waiting)}: "
            f"schedule() median {times[len(times) // 2] * 1e3:.3f} ms, "
            f"p90 {times[int(len(times) * 0.9)] * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
