"""Writes a synthetic trace in the Azure LLM inference CSV format
(TIMESTAMP,ContextTokens,GeneratedTokens) shaped like the Azure 2023 conversation trace,
which cannot be downloaded here: 19,365 requests over an hour by default (its size), Poisson
arrivals (the real trace is burstier), and log-normal lengths around the conversation
medians Splitwise reports for it (Patel et al., ISCA 2024: 1020 prompt tokens, 129 output
tokens), prompts clipped to 1..8000 and outputs to 1..2000 tokens.

    python -m benchmarks.azure_conversation OUT.csv [--requests 19365] [--seconds 3600]
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

PROMPT_MEDIAN, OUTPUT_MEDIAN = 1020, 129  # Splitwise, conversation trace
SPREAD = 0.8  # log-normal sigma: a guess, not a published figure


def write_conversation_trace(
    path: Path, requests: int = 19_365, seconds: float = 3600.0, seed: int = 0
) -> None:
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, seconds, requests))  # a Poisson process's order stats
    prompts = np.clip(rng.lognormal(np.log(PROMPT_MEDIAN), SPREAD, requests), 1, 8000)
    outputs = np.clip(rng.lognormal(np.log(OUTPUT_MEDIAN), SPREAD, requests), 1, 2000)
    start = datetime(2023, 11, 16, 18, 15, 46)
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, n_in, n_out in zip(arrivals.tolist(), prompts.astype(int).tolist(),
                                  outputs.astype(int).tolist(), strict=True):  # fmt: skip
            stamp = (start + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
            f.write(f"{stamp}0,{n_in},{n_out}\n")  # seven fractional digits, as Azure's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=int, default=19_365)
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_conversation_trace(args.out, args.requests, args.seconds, args.seed)
    print(args.out)


if __name__ == "__main__":
    main()
