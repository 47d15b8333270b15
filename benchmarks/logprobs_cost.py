"""What log-probabilities cost: one workload run by the engine with none asked, with
logprobs=5 (each output token's 5 most likely), and with echo (the prompt's too).

    python -m benchmarks.logprobs_cost [--rounds 3] [--base DIR] OVERRIDES...
    python -m benchmarks.logprobs_cost model=gguf model.path=SmolLM2-135M-Instruct.Q4_1.gguf \\
        max_model_len=1024 --requests 8 --prompt 128 --output 32

The engine (OVERRIDES as `python -m pipeline` takes them; default model=tiny) is built
once; each round runs the same synthetic requests (ignore_eos, prefix caching off) once per
mode, the modes in turn. Output tok/s is output tokens over the engine's run time; total
tok/s counts the prompt tokens too. Best of the rounds per mode. --base DIR also runs, in
each round, the no-logprobs mode with the code in DIR (an older commit's tree: `git archive
C | tar -x -C DIR`), in a process of its own on the same overrides: a request that asks for
none should be as fast as before logprobs existed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.config.compose import compose_config
from pipeline.job.engine import Engine
from stages.scheduling.request import Request, SamplingParams

try:  # the engine builder's home since the executors' seam, and before it
    from pipeline.executors import build_engine
except ImportError:  # an older tree (--base)
    from pipeline.executors.build import build_engine  # type: ignore[no-redef,attr-defined]

MODES = {
    "none": {},
    "logprobs=5": {"logprobs": 5},
    "echo+logprobs=5": {"logprobs": 5, "prompt_logprobs": 5},
}


def workload(args: argparse.Namespace) -> list[str]:
    n, p, o = args.requests, args.prompt, args.output
    return [f"workload.num_requests={n}", f"workload.min_prompt_tokens={p}",
            f"workload.max_prompt_tokens={p}", f"workload.min_new_tokens={o}",
            f"workload.max_new_tokens={o}", "prefix_caching=false"]  # fmt: skip


def fresh(requests: list[Request], asked: dict) -> list[Request]:
    """The same prompts as new requests, asking for `asked`."""
    return [
        Request(
            r.id,
            r.index,
            r.prompt,
            list(r.prompt_ids),
            r.max_new_tokens,
            ignore_eos=True,
            sampling=SamplingParams(**asked),
        )  # fmt: skip
        for r in requests
    ]


def one_round(engine: Engine, requests: list[Request], asked: dict) -> tuple[float, float]:
    """Output and total tok/s of one run of the requests, asking for `asked`."""
    batch = fresh(requests, asked)
    seconds = engine.run(batch)
    out = sum(len(r.output_ids) for r in batch)
    return out / seconds, (out + sum(len(r.prompt_ids) for r in batch)) / seconds


def base_round(args: argparse.Namespace) -> tuple[float, float]:
    """One round of the no-logprobs mode with DIR's code: this file run in a process of its
    own with DIR first on the path."""
    base = args.base.resolve()
    conf = base / "pipeline" / "conf"  # Hydra's configs as the editable install maps them
    if not conf.exists():
        conf.symlink_to(base / "conf", target_is_directory=True)
    command = [sys.executable, __file__, "--modes", "none", "--json", *forwarded(args)]
    env = {**os.environ, "PYTHONPATH": str(base)}
    done = subprocess.run(command, cwd=base, env=env, capture_output=True, text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])["none"]  # the last line
    return figures["best_output_tok_s"], figures["best_total_tok_s"]


def measure(args: argparse.Namespace, modes: list[str]) -> dict[str, dict]:
    """Per mode: output and total tok/s of every round, and the best. The rounds take the
    modes in turn (and --base's after them), so a change of the machine's load falls on
    all alike."""
    engine, requests = build_engine(compose_config([*args.overrides, *workload(args)]))
    engine.run(fresh(requests[:2], {}))  # warm-up: first-call costs out of the rounds
    rounds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            rounds[mode].append(one_round(engine, requests, MODES[mode]))
        if args.base is not None:
            rounds.setdefault("none (base)", []).append(base_round(args))
    return {
        mode: {
            "output_tok_s": [r[0] for r in got],
            "total_tok_s": [r[1] for r in got],
            "best_output_tok_s": max(r[0] for r in got),
            "best_total_tok_s": max(r[1] for r in got),
        }  # fmt: skip
        for mode, got in rounds.items()
    }


def forwarded(args: argparse.Namespace) -> list[str]:
    return ["--rounds", "1", "--requests", str(args.requests), "--prompt",
            str(args.prompt), "--output", str(args.output), *args.overrides]  # fmt: skip


def table(results: dict[str, dict]) -> list[str]:
    lines = ["| mode | output tok/s (best) | total tok/s (best) | output tok/s, each round |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for mode, got in results.items():
        each = ", ".join(f"{x:.1f}" for x in got["output_tok_s"])
        lines.append(f"| {mode} | {got['best_output_tok_s']:.1f} | "
                     f"{got['best_total_tok_s']:.1f} | {each} |")  # fmt: skip
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.logprobs_cost",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", default=["model=tiny"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--output", type=int, default=32, help="output tokens per request")
    parser.add_argument("--modes", default=",".join(MODES), help="default: %(default)s")
    parser.add_argument("--base", type=Path, help="an older tree: its no-logprobs figure too")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = measure(args, args.modes.split(","))
    print(json.dumps(results) if args.json else "\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
