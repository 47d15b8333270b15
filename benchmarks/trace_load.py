"""Loads a generated 1,000,000-row Azure-format trace through the real trace workload: load
time, peak resident set, and the resident set after a thousand requests' prompt ids are used.

    python -m benchmarks.trace_load [--rows 1000000] [--touch 1000]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from pipeline.schema import TraceWorkloadConf
from stages.loading.tokenizer import ByteTokenizer
from stages.trace import TraceWorkload


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def write_azure_trace(path: Path, rows: int, seed: int = 0) -> None:
    """Azure 2023 code-trace shapes: Poisson arrivals at ~50/s, prompts up to 8k tokens."""
    rng = np.random.default_rng(seed)
    gaps = np.cumsum(rng.exponential(0.02, rows))
    prompts = rng.integers(1, 8192, rows)
    outputs = rng.integers(1, 512, rows)
    start = datetime(2023, 11, 16, 18, 15, 46)
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for gap, n_in, n_out in zip(gaps.tolist(), prompts.tolist(), outputs.tolist(), strict=True):
            stamp = (start + timedelta(seconds=gap)).strftime("%Y-%m-%d %H:%M:%S.%f")
            f.write(f"{stamp}0,{n_in},{n_out}\n")  # seven fractional digits, as Azure's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--touch", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "azure.csv"
        t = time.perf_counter()
        write_azure_trace(path, args.rows)
        print(f"wrote {args.rows:,} rows ({path.stat().st_size / 2**20:.0f} MB) in "
              f"{time.perf_counter() - t:.1f} s")  # fmt: skip
        before = current_rss_mb()
        t = time.perf_counter()
        conf = TraceWorkloadConf(path=str(path), seed=0, max_model_len=8192, max_num_seqs=32)
        workload = TraceWorkload(**{k: v for k, v in vars(conf).items() if k != "_target_"})
        requests = workload.load(ByteTokenizer(add_bos=True))
        load_s = time.perf_counter() - t
    loaded = current_rss_mb()
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    print(f"loaded {len(requests):,} requests ({prompt_tokens:,} prompt tokens) in {load_s:.2f} s")
    print(f"resident set: {before:.0f} MB before, {loaded:.0f} MB after "
          f"({(loaded - before) * 2**20 / len(requests):.0f} B a request), "
          f"peak {peak_rss_mb():.0f} MB")  # fmt: skip
    t = time.perf_counter()
    touched = sum(r.prompt_ids[0] >= 0 for r in requests[: args.touch])
    print(f"touched {touched:,} requests' prompt ids in {time.perf_counter() - t:.2f} s: "
          f"resident set {current_rss_mb():.0f} MB (the most recently used are kept)")  # fmt: skip


if __name__ == "__main__":
    main()
