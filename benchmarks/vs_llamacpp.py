"""This engine against llama.cpp (and transformers) on the same GGUF file: same prompts,
same threads.

    pip install -e '.[llamacpp,peer]'  # llama-cpp-python (built from source where no wheel
                                       # fits), transformers on torch's CPU build
    python -m benchmarks.vs_llamacpp FILE.gguf --variant model.weights=int8 \\
        --out benchmarks/vs_llamacpp.md

Both sides generate `--new-tokens` greedy tokens (end-of-sequence ignored) for each of the
same chat prompts, token ids rendered once by this engine's tokenizer and chat template,
with `--threads` threads each: one stream, then `--streams` at once. llama-cpp-python's
`Llama` serves one sequence at a time, so it is measured at one stream only (its streams
would run one after another, at that rate). Each figure
is a fresh process (its model loaded and warmed outside the timing) that reports its
output tokens over the generation's wall time and its peak RSS; the two sides alternate,
round after round, so that a shared machine's load falls on both alike; the best of
`--rounds` is kept, with the load average beside each round. transformers' generate()
(benchmarks/peer.py's way: left-padded batches, float32 from the same file) is measured at
one stream and at `--streams` in one batch, where torch and transformers are installed;
its best is set against this engine's best. Without llama-cpp-python (or transformers)
that side is left out. `--profile` adds where a decode step's time goes
(benchmarks/decode_profile.py), at one and at `--streams` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks.peer_gguf import chat_lines
from benchmarks.report import write_report

# Every prompt's ids are rendered once by this engine's tokenizer (and chat template):
# both sides then read the same tokens.
PROMPTS_FILE = "prompts.json"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def engine_overrides(gguf: Path, jsonl: Path, streams: int, threads: int, extra: list[str]):
    return [
        "model=gguf",
        f"model.path={gguf}",
        "workload=jsonl",
        f"workload.path={jsonl}",
        f"num_threads={threads}",
        f"max_num_seqs={streams}",
        "max_model_len=1024",
        "prefix_caching=false",  # the warm-up's prompts would otherwise be cached
        *extra,
    ]


def fresh(requests, new_tokens: int):
    """Unserved copies of `requests`, each asking for `new_tokens`."""
    from stages.scheduling.request import Request

    return [
        Request(
            id=r.id,
            index=r.index,
            prompt=r.prompt,
            prompt_ids=list(r.prompt_ids),
            max_new_tokens=new_tokens,
            ignore_eos=True,
        )
        for r in requests
    ]


def run_ours(args: argparse.Namespace) -> dict:
    """This engine serving `streams` prompts at once, after an untimed warm-up."""
    from pipeline.config.compose import compose_config
    from pipeline.executors import build_engine

    with tempfile.TemporaryDirectory() as folder:
        jsonl = Path(folder) / "chat.jsonl"
        lines = chat_lines(args.streams, args.new_tokens)
        jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
        cfg = compose_config(
            engine_overrides(args.gguf, jsonl, args.streams, args.threads, args.setting.split())
        )
        engine, requests = build_engine(cfg)
    engine.run(fresh(requests, 4))
    timed = fresh(requests, args.new_tokens)
    start = time.perf_counter()
    engine.run(timed)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.output_ids) for r in timed)
    prompts = [list(r.prompt_ids) for r in sorted(timed, key=lambda r: r.index)]
    outputs = [r.output_ids for r in sorted(timed, key=lambda r: r.index)]
    return {"tokens": tokens, "seconds": seconds, "prompts": prompts, "outputs": outputs}


def run_llamacpp(args: argparse.Namespace) -> dict:
    """llama.cpp generating for the same prompt ids, one sequence after another."""
    from llama_cpp import Llama

    prompts = json.loads(Path(args.prompts).read_text())[: args.streams]
    llm = Llama(
        model_path=str(args.gguf),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_ctx=1024,
        verbose=False,
    )

    def generate(ids: list[int], count: int) -> list[int]:
        llm.reset()
        out = []
        for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            out.append(token)
            if len(out) == count:
                return out
        return out

    generate(prompts[0], 4)  # warm-up
    start = time.perf_counter()
    outputs = [generate(ids, args.new_tokens) for ids in prompts]
    seconds = time.perf_counter() - start
    return {"tokens": sum(map(len, outputs)), "seconds": seconds, "outputs": outputs}


def run_transformers(args: argparse.Namespace) -> dict:
    """Hugging Face transformers' generate() on the same file (dequantised to float32) and
    prompt ids, `streams` prompts a batch, left-padded (benchmarks/peer.py's way)."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.peer import peer_generate_with

    torch.set_num_threads(args.threads)
    prompts = json.loads(Path(args.prompts).read_text())[: args.streams]
    model = AutoModelForCausalLM.from_pretrained(
        str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32
    ).eval()
    pad = model.config.pad_token_id
    pad = pad if pad is not None else model.config.eos_token_id
    outputs, seconds = peer_generate_with(model, prompts, args.new_tokens, args.streams, pad)
    return {"tokens": sum(map(len, outputs)), "seconds": seconds, "outputs": outputs}


WORKERS = {"ours": run_ours, "llamacpp": run_llamacpp, "transformers": run_transformers}


def worker(args: argparse.Namespace) -> None:
    """One measurement in this process; a JSON line on stdout."""
    run = WORKERS[args.worker]
    result = run(args)
    result["rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(result), flush=True)


class Side(NamedTuple):
    """One column of the comparison: this engine with a setting (from a checkout), or
    llama.cpp."""

    label: str
    worker: str  # a WORKERS key
    setting: str = ""
    tree: Path | None = None  # another checkout of this engine, run from there


def sides(args: argparse.Namespace) -> list[Side]:
    ours = [Side("this engine", "ours", args.setting)]
    ours += [Side(f"this engine, {v}", "ours", f"{args.setting} {v}") for v in args.variant]
    if args.baseline:
        commit = subprocess.run(
            ["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        ours.append(
            Side(f"this engine at {commit or args.baseline}", "ours", args.setting, args.baseline)
        )
    if have_llamacpp() and not args.skip_llamacpp:
        ours.append(Side("llama.cpp", "llamacpp"))
    if have_transformers() and not args.skip_transformers:
        ours.append(Side("transformers", "transformers"))
    return ours


def measure(args: argparse.Namespace, side: Side, streams: int, prompts: Path) -> dict:
    """One fresh worker process's figures, with the load average as it starts."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.vs_llamacpp",
        str(args.gguf.resolve()),
        f"--worker={side.worker}",
        f"--streams={streams}",
        f"--threads={args.threads}",
        f"--new-tokens={args.new_tokens}",
        f"--prompts={prompts}",
        f"--setting={side.setting}",
    ]
    env = dict(os.environ)
    if side.tree is not None:
        env["PYTHONPATH"] = str(side.tree.resolve())
    load = os.getloadavg()[0]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=side.tree, env=env
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{side.label} failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["load"] = load
    result["tok_s"] = result["tokens"] / result["seconds"]
    return result


def have_llamacpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def have_transformers() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def read_prompts(path: Path) -> list[list[int]]:
    return json.loads(path.read_text()) if path.exists() else []


def rounds(args: argparse.Namespace, folder: Path) -> dict[tuple[str, int], list[dict]]:
    """Every (side, streams) measured each round, the sides alternating; the first engine
    run writes the prompt ids every other side reads."""
    prompts = folder / PROMPTS_FILE
    results: dict[tuple[str, int], list[dict]] = {}
    for round_index in range(args.rounds):
        for streams in (1, args.streams):
            for side in sides(args):
                if side.worker == "llamacpp" and streams > 1:
                    continue  # one sequence after another: its one-stream rate again
                result = measure(args, side, streams, prompts)
                if len(result.get("prompts", [])) > len(read_prompts(prompts)):
                    prompts.write_text(json.dumps(result["prompts"]))
                results.setdefault((side.label, streams), []).append(result)
                print(
                    f"round {round_index + 1}: {side.label}, {streams} stream(s): "
                    f"{result['tok_s']:.1f} tok/s, peak RSS {result['rss_mib']:.0f} MiB, "
                    f"load {result['load']:.1f}",
                    flush=True,
                )
    return results


def agreement(results: dict[tuple[str, int], list[dict]], streams: int) -> str:
    """How many leading greedy tokens the two sides share, prompt by prompt."""
    ours, theirs = results.get(("this engine", streams)), results.get(("llama.cpp", streams))
    if not ours or not theirs:
        return ""
    shared = []
    for a, b in zip(ours[-1]["outputs"], theirs[-1]["outputs"], strict=False):
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        shared.append(same)
    return (
        f"Greedy tokens shared before the first difference, prompt by prompt ({streams} "
        f"streams): {', '.join(map(str, shared))} of {len(ours[-1]['outputs'][0])}."
    )


def report(args: argparse.Namespace, results: dict[tuple[str, int], list[dict]]) -> list[str]:
    best = {key: max(runs, key=lambda r: r["tok_s"]) for key, runs in results.items()}
    lines = [
        f"## {args.gguf.name}: this engine against llama.cpp",
        "",
        f"`python -m benchmarks.vs_llamacpp {args.gguf.name} --threads {args.threads} "
        f"--new-tokens {args.new_tokens} --streams {args.streams} --rounds {args.rounds}"
        + (f" --setting '{args.setting}'" if args.setting else "")
        + "`: chat prompts, greedy, end-of-sequence ignored, "
        f"{args.new_tokens} new tokens a stream, {args.threads} threads each side, "
        f"best of {args.rounds} rounds, the sides alternating; load = the 1-minute load "
        f"average as each run started ({os.cpu_count()} cores).",
        "",
        "| side | streams | best tok/s | rounds (tok/s @ load) | peak RSS MiB |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for (side, streams), runs in sorted(results.items(), key=lambda kv: kv[0][1]):
        cells = ", ".join(f"{r['tok_s']:.1f} @ {r['load']:.1f}" for r in runs)
        peak = max(r["rss_mib"] for r in runs)
        lines.append(
            f"| {side} | {streams} | {best[side, streams]['tok_s']:.1f} | {cells} | {peak:.0f} |"
        )
    ratios = ratio_lines(best, args.streams)
    return [*lines, "", *ratios, "", agreement(results, 1)]


def ratio_lines(best: dict[tuple[str, int], dict], streams: int) -> list[str]:
    """Each of this engine's sides against llama.cpp's one stream (the issue's goals: one
    stream at 0.5x or more, `streams` streams at 2x or more) and against transformers at
    its best, one batch or `streams` (goal: transformers at 0.5x of this engine or less)."""
    one = best.get(("llama.cpp", 1))
    peer = [
        best[key]["tok_s"]
        for key in (("transformers", 1), ("transformers", streams))
        if key in best
    ]
    lines = [] if one else ["llama-cpp-python is not installed: llama.cpp was not measured."]
    engine = (side for side, _ in best if side not in ("llama.cpp", "transformers"))
    for label in dict.fromkeys(engine):
        alone, many = best[label, 1]["tok_s"], best[label, streams]["tok_s"]
        parts = []
        if one:
            parts += [
                f"one stream / llama.cpp's = **{alone / one['tok_s']:.2f}x** (goal 0.5x)",
                f"{streams} streams / llama.cpp's one stream = **{many / one['tok_s']:.2f}x** "
                "(goal 2x)",
            ]
        if peer:
            parts.append(
                f"transformers at its best / this side at its best = "
                f"**{max(peer) / max(alone, many):.2f}x** (goal 0.5x or less)"
            )
        if parts:
            lines.append(f"- {label}: " + "; ".join(parts))
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path, help="a GGUF file (llama family)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=8, help="streams at once, besides one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--setting", default="", help="extra overrides for this engine")
    parser.add_argument(
        "--variant", action="append", default=[], help="overrides measured as another side"
    )
    parser.add_argument("--baseline", type=Path, help="another checkout, measured alongside")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--profile", action="store_true", help="add the decode step's profile")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as folder:
        results = rounds(args, Path(folder))
    text = "\n".join(report(args, results)) + "\n"
    if args.profile:
        from benchmarks.decode_profile import profile_report

        text += (
            "\n"
            + "\n".join(profile_report(args.gguf, args.threads, args.streams, args.setting.split()))
            + "\n"
        )
    print(text)
    if args.out:
        write_report(args.out, text)


if __name__ == "__main__":
    main()
