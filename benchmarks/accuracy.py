"""Accuracy through the server: lm-evaluation-harness against `python -m pipeline.serve`.

    python -m benchmarks.accuracy model=gguf model.path=SmolLM2-135M-Instruct.Q4_1.gguf \\
        --limit 100 --out runs/acc-a
    python -m benchmarks.accuracy --chat model=gguf model.path=SmolLM2-135M-Instruct.Q4_1.gguf \\
        --limit 50 --out runs/acc-chat   (/v1/chat/completions)
    python -m benchmarks.accuracy --compare runs/acc-a runs/acc-b   (item agreement)
    python -m benchmarks.accuracy --reference SmolLM2-135M-Instruct.Q4_1.gguf \\
        --limit 100 --out runs/acc-hf   (transformers, no server)

Starts the server on the given overrides (any of `python -m pipeline.serve`) on a free
loopback port, runs lm-eval's `local-completions` model against it on the repository's
tasks (benchmarks/tasks: hpu_arith_choice, multiple choice by log-likelihood, which needs
logprobs with echo; hpu_unit_conversion, generation by exact match), with the server's own
tokenizer (`tokenizer_backend=remote`: /tokenize, /detokenize, /tokenizer_info) and nothing
downloaded (Hugging Face offline). Prints each task's accuracy with its standard error,
and writes lm-eval's results JSON (lm_eval_results.json; per-item samples under lm_eval/)
and the server's run folder (server/) into the run folder --out. Needs the `eval` extra
(pip install -e '.[eval]'). Exit code 2 when the server or lm-eval fails.

--chat runs lm-eval's `local-chat-completions` on /v1/chat/completions instead
(`--apply_chat_template`, the few-shot examples as chat turns the server templates, no
tokenizer on lm-eval's side); chat has no log-likelihoods, so the generation task only.

--reference GGUF runs no server: lm-eval's own `hf` model, transformers reading the GGUF
(from_pretrained(gguf_file=...), dequantised to float32 on CPU, its tokenizer from the
file), on the same tasks and items; --compare of the two run folders gives the agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "benchmarks" / "tasks"
DEFAULT_TASKS = "hpu_arith_choice,hpu_unit_conversion"
CHAT_TASKS = "hpu_unit_conversion"  # chat completions have no log-likelihoods
# Nothing from the Hugging Face hub at run time: the tasks are local files and the
# tokenizer is the server's.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class Failed(Exception):
    """The server or lm-eval did not do its part; the message says which and why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(overrides: list[str], out: Path, port: int) -> subprocess.Popen:
    log = (out / "server.log").open("w")
    command = [sys.executable, "-m", "pipeline.serve", *overrides, "serve.host=127.0.0.1",
               f"serve.port={port}", f"hydra.run.dir={out / 'server'}"]  # fmt: skip
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def wait_ready(server: subprocess.Popen, url: str, out: Path, timeout_s: float) -> dict:
    """Polls /health until the server is ready (bounded); returns its /v1/models entry."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = (out / "server.log").read_text()[-2000:]
            raise Failed(f"the server exited with code {server.returncode}:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise Failed(f"the server was not ready within {timeout_s:.0f} s (see {out}/server.log)")


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()  # SIGTERM: a graceful stop, metrics.json written
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def lm_eval_command(args: argparse.Namespace, url: str, model: dict, out: Path) -> list[str]:
    """lm-eval against the server: `local-completions` on /v1/completions with the server's
    tokenizer, or (--chat) `local-chat-completions` on /v1/chat/completions, the prompts as
    chat messages (`--apply_chat_template`; the server applies the model's template) and no
    tokenizer on lm-eval's side."""
    if args.chat:
        name, route, tokenizer = (
            "local-chat-completions",
            "chat/completions",
            ["tokenizer_backend=None"],
        )
    else:
        name, route = "local-completions", "completions"
        tokenizer = ["tokenizer_backend=remote", "tokenized_requests=True"]
    model_args = ",".join([
        f"model={model['id']}",
        f"base_url={url}/v1/{route}",
        *tokenizer,
        f"max_length={model['max_model_len']}",
        f"num_concurrent={args.concurrency}",
        "max_retries=1",
        "timeout=600",
    ])  # fmt: skip
    command = [sys.executable, "-m", "lm_eval", "--model", name,
               "--model_args", model_args, "--tasks", args.tasks,
               "--include_path", str(TASKS), "--output_path", str(out / "lm_eval"),
               "--log_samples"]  # fmt: skip
    command += ["--apply_chat_template"] if args.chat else []
    return command + (["--limit", str(args.limit)] if args.limit else [])


def reference_command(args: argparse.Namespace, out: Path) -> list[str]:
    """lm-eval's `hf` model on the GGUF --reference names (the `peer` extra's transformers)."""
    gguf = args.reference.resolve()
    model_args = f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32"
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", model_args,
               "--device", "cpu", "--batch_size", "4", "--tasks", args.tasks,
               "--include_path", str(TASKS), "--output_path", str(out / "lm_eval"),
               "--log_samples"]  # fmt: skip
    return command + (["--limit", str(args.limit)] if args.limit else [])


def run_lm_eval(command: list[str], out: Path) -> None:
    (out / "lm_eval_command.txt").write_text(" ".join(command) + "\n")
    env = {**os.environ, **OFFLINE}
    with (out / "lm_eval.log").open("w") as log:
        done = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = (out / "lm_eval.log").read_text()[-3000:]
        raise Failed(f"lm-eval exited with code {done.returncode}:\n{tail}")


def results_of(out: Path) -> dict:
    """lm-eval's results JSON (the newest), copied into the run folder."""
    found = sorted((out / "lm_eval").rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise Failed(f"lm-eval wrote no results under {out / 'lm_eval'}")
    shutil.copyfile(found[-1], out / "lm_eval_results.json")
    return json.loads(found[-1].read_text())


def report(results: dict, wall_s: float) -> list[str]:
    """One line per task: its metric, accuracy ± standard error, items."""
    lines = []
    samples = results.get("n-samples", {})
    for task, metrics in sorted(results["results"].items()):
        for key, value in metrics.items():
            name, comma, filter_name = key.partition(",")  # "acc,none": metric, filter
            if not comma or name.endswith("_stderr") or not isinstance(value, int | float):
                continue
            stderr = metrics.get(f"{name}_stderr,{filter_name}")
            error = f" ± {stderr:.4f}" if isinstance(stderr, int | float) else ""
            items = samples.get(task, {}).get("effective", "?")
            lines.append(f"{task}  {name} ({filter_name})  {value:.4f}{error}  items={items}")
    lines.append(f"wall time {wall_s:.0f} s")
    return lines


def answers(run: Path) -> dict[str, dict[int, tuple[object, list[float]]]]:
    """Per task and item: the answer lm-eval took (a multiple choice's most likely choice,
    a generation's filtered text) and the choices' log-likelihoods (none for generation)."""
    out: dict[str, dict[int, tuple[object, list[float]]]] = {}
    for path in sorted((run / "lm_eval").rglob("samples_*.jsonl")):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        items = out.setdefault(task, {})
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            resps = sample["filtered_resps"]
            if sample["metrics"] == ["exact_match"]:
                items[sample["doc_id"]] = (resps[0], [])
            else:
                scores = [float(r[0]) for r in resps]
                items[sample["doc_id"]] = (scores.index(max(scores)), scores)
    return out


def agreement(first: Path, second: Path) -> list[str]:
    """Per task, on the items both runs scored: how many got the same answer, and the
    largest difference of a choice's log-likelihood."""
    a, b = answers(first), answers(second)
    lines = []
    for task in sorted(a.keys() & b.keys()):
        shared = sorted(a[task].keys() & b[task].keys())
        same = sum(a[task][i][0] == b[task][i][0] for i in shared)
        pairs = [zip(a[task][i][1], b[task][i][1], strict=True) for i in shared]
        gaps = [abs(x - y) for pair in pairs for x, y in pair]
        gap = f", log-likelihoods within {max(gaps):.2e}" if gaps else ""
        lines.append(f"{task}  same answer on {same}/{len(shared)} items{gap}")
    return lines


def evaluate(args: argparse.Namespace) -> list[str]:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if args.reference is not None:  # transformers in lm-eval's process, no server
        run_lm_eval(reference_command(args, out), out)
    else:
        port = args.port or free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(args.overrides, out, port)
        try:
            model = wait_ready(server, url, out, args.start_timeout_s)
            run_lm_eval(lm_eval_command(args, url, model, out), out)
        finally:
            stop_server(server)
    lines = report(results_of(out), time.monotonic() - start)
    (out / "accuracy.txt").write_text("\n".join(lines) + "\n")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.accuracy",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", help="the server's overrides (model=..., ...)")
    parser.add_argument("--tasks", help=f"default: {DEFAULT_TASKS} ({CHAT_TASKS} with --chat)")
    parser.add_argument(
        "--chat", action="store_true", help="lm-eval's local-chat-completions (generation only)"
    )
    parser.add_argument("--limit", type=int, default=0, help="items per task (0: all)")
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    parser.add_argument("--out", type=Path, default=Path("outputs/accuracy") / stamp,
                        help="the run folder (default: outputs/accuracy/<time>)")  # fmt: skip
    parser.add_argument("--port", type=int, default=0, help="the server's (0: a free one)")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="requests in flight (batched by the engine)"
    )
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("RUN", "OTHER"),
                        help="no run: the item agreement of two run folders")  # fmt: skip
    parser.add_argument("--reference", type=Path, metavar="GGUF",
                        help="no server: lm-eval's hf model on this GGUF")  # fmt: skip
    args = parser.parse_args(argv)
    if args.tasks is None:
        args.tasks = CHAT_TASKS if args.chat else DEFAULT_TASKS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        print("\n".join(agreement(*args.compare)))
        return 0
    try:
        import lm_eval  # noqa: F401  (the `eval` extra)
    except ImportError:
        print("Error: lm-eval is not installed: pip install -e '.[eval]'", file=sys.stderr)
        return 2
    try:
        lines = evaluate(args)
    except Failed as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print(f"run folder: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
