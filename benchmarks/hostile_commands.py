"""The classes of issue 57 for `python -m benchmarks.hostile`: what a command writes or reads
(launch-script injection, links, damaged run folders, resume, failed runs, start-up checks,
jsonl rows, a plan without an SLO) as a user's shell runs it, and what a live server
answers (log-probabilities of a simulated model, token-id prompts, echoed values, a foreign
Host, HTTP the parser refuses, a template render during /tokenize).

A command case runs `python -m ...` in a fresh process in its own folder and checks the exit
code, the one-line error, and what is on disk afterwards (a link's target untouched, no file
the injected command would make). Server cases use the tiny, simulated and GGUF servers
benchmarks/hostile.py starts.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from benchmarks.hostile import JSON, Case, body_case, healthy, post

PLAN_JOB = ["executor=simulated", "hardware=gaudi2", "model=spec/llama31_8b"]
TINY_RUN = ["model=tiny", "max_num_seqs=4", "max_model_len=256", "workload.num_requests=4",
            "num_threads=1"]  # fmt: skip
SIMULATED = ["executor=simulated", "hardware=gaudi3", "model=spec/ernie45_0p3b",
             "max_num_seqs=4", "max_model_len=256"]  # fmt: skip


def command(folder: Path, module: str, *args: object) -> subprocess.CompletedProcess:
    """`python -m module args` in `folder`, as a user types it."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=folder,
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip


def one_line(done: subprocess.CompletedProcess, code: int) -> bool:
    """Exit `code`, and stderr a single `Error: ` line (the logs aside)."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    return done.returncode == code and len(errors) == 1 and "Traceback" not in done.stderr


class Folders:
    """A fresh folder per case, and one run folder made once by `python -m pipeline`
    (executor=simulated: a plan job's kind) that the deploy and resume cases copy."""

    def __init__(self, root: Path) -> None:
        self.root, self.count = root, 0
        self._run: Path | None = None

    def fresh(self) -> Path:
        self.count += 1
        path = self.root / f"case{self.count}"
        path.mkdir(parents=True)
        return path

    def run(self) -> Path:
        if self._run is None:
            self._run = self.root / "run"
            done = command(self.root, "pipeline", *PLAN_JOB, "workload.num_requests=4",
                           f"hydra.run.dir={self._run}")  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"the run folder could not be made: {done.stderr[-500:]}")
        return self._run

    def copy(self, name: str = "run") -> Path:
        target = self.fresh() / name
        subprocess.run(["cp", "-r", str(self.run()), str(target)], check=True)
        return target


def command_case(group: str, name: str, check: Callable[[], bool]) -> Case:
    return Case(group, name, lambda url: check())


# ------------------------------------------------------------------------- deploy


def injection_cases(f: Folders) -> list[Case]:
    def model_id() -> bool:
        run = f.copy()
        done = command(run.parent, "pipeline.deploy", run, "--model", "x\ntouch PWNED #")
        return one_line(done, 2) and not (run / "deploy").exists()

    def run_path() -> bool:
        run = f.copy("r\ntouch PWNED #")
        done = command(run.parent, "pipeline.deploy", run)
        return one_line(done, 2) and not (run / "deploy").exists()

    def quoted() -> bool:
        run = f.copy("r $(touch PWNED1) 'x")
        model = "org/m $(touch PWNED2) `touch PWNED3` ' \" ;touch PWNED4"
        if command(run.parent, "pipeline.deploy", run, "--model", model).returncode != 0:
            return False
        scripts = sorted((run / "deploy").glob("*.sh"))
        for script in scripts:  # what runs before the server's exec
            head = script.read_text().split("\nexec ")[0]
            subprocess.run(["bash", "-c", head], cwd=run.parent, timeout=30, check=False)
        return bool(scripts) and not list(run.parent.glob("PWNED*"))

    return [command_case("deploy injection", "--model with a newline", model_id),
            command_case("deploy injection", "run folder path with a newline", run_path),
            command_case("deploy injection", "$(...), backticks and quotes", quoted)]  # fmt: skip


def link_cases(f: Folders) -> list[Case]:
    def victim(folder: Path, name: str = "victim") -> Path:
        target = folder / name
        target.write_text("precious\n")
        return target

    def out_link() -> bool:
        run = f.copy()
        target, out = victim(run.parent), run.parent / "out"
        out.mkdir()
        (out / "vllm-gaudi.sh").symlink_to(target)
        done = command(run.parent, "pipeline.deploy", run, "--out", out)
        return one_line(done, 2) and target.read_text() == "precious\n"

    def deploy_link() -> bool:
        run = f.copy()
        elsewhere = run.parent / "elsewhere"
        elsewhere.mkdir()
        (run / "deploy").symlink_to(elsewhere)
        done = command(run.parent, "pipeline.deploy", run)
        return one_line(done, 2) and not os.listdir(elsewhere)

    def summary_link(name: str) -> Callable[[], bool]:
        def check() -> bool:
            run = f.copy("0")
            sweep = run.parent
            (run / ".hydra").mkdir(exist_ok=True)
            (run / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
            target = victim(sweep.parent, f"{sweep.name}-target")
            (sweep / name).symlink_to(target)
            done = command(sweep.parent, "pipeline.summary", sweep)
            return one_line(done, 2) and target.read_text() == "precious\n"

        return check

    return [command_case("links", "deploy --out DIR holding a link", out_link),
            command_case("links", "RUN/deploy a link", deploy_link),
            *(command_case("links", f"sweep {name} a link", summary_link(name))
              for name in ("summary.csv", "summary.md", "summary.png"))]  # fmt: skip


def damaged_cases(f: Folders) -> list[Case]:
    def damaged(change: Callable[[Path], None]) -> Callable[[], bool]:
        def check() -> bool:
            run = f.copy()
            change(run)
            return one_line(command(run.parent, "pipeline.deploy", run), 2)

        return check

    def config_link(run: Path) -> None:
        other = run.parent / "other"
        other.write_bytes(bytes(range(256)) * 4)
        (run / "resolved_config.yaml").unlink()
        (run / "resolved_config.yaml").symlink_to(other)

    def mapping_len(run: Path) -> None:
        text = (run / "resolved_config.yaml").read_text()
        lines = [("max_model_len: {a: 1}" if line.startswith("max_model_len:") else line)
                 for line in text.splitlines()]  # fmt: skip
        (run / "resolved_config.yaml").write_text("\n".join(lines) + "\n")

    return [command_case("damaged run folder", "resolved_config.yaml a link to binary",
                         damaged(config_link)),
            command_case("damaged run folder", "metrics.json [1,2]",
                         damaged(lambda run: (run / "metrics.json").write_text("[1, 2]"))),
            command_case("damaged run folder", "max_model_len a mapping",
                         damaged(mapping_len))]  # fmt: skip


# --------------------------------------------------------------------------- runs


def run_cases(f: Folders) -> list[Case]:
    def run_exits(overrides: list[str], code: int, said: str) -> Callable[[], bool]:
        def check() -> bool:
            folder = f.fresh()
            done = command(folder, "pipeline", *overrides, f"hydra.run.dir={folder}/r")
            return done.returncode == code and said in done.stderr

        return check

    def jsonl(content: bytes) -> list[str]:
        path = f.fresh() / "w.jsonl"
        path.write_bytes(content)
        return [*TINY_RUN, "workload=jsonl", f"workload.path={path}"]

    noise = random.Random(0).randbytes(200_000)
    blank = b'{"prompt": "a"}\n\nnot json\n{"prompt": "b"}\n{"prompt": "c"}\n'
    huge = b'{"prompt": "' + b"x" * 30_000_000 + b'"}\n{"prompt": "a"}\n'
    every = "Error: every request failed"

    def rows_after_a_blank() -> bool:
        folder = f.fresh()
        done = command(folder, "pipeline", *jsonl(blank), f"hydra.run.dir={folder}/r")
        lines = [json.loads(x) for x in (folder / "r" / "generations.jsonl").open()]
        served = sorted(g["id"] for g in lines if g.get("error") is None)
        return done.returncode == 0 and served == ["line-1", "line-4", "line-5"]

    def huge_line() -> bool:
        folder = f.fresh()
        start = time.monotonic()
        done = command(folder, "pipeline", *jsonl(huge), "max_model_len=512",
                       f"hydra.run.dir={folder}/r")  # fmt: skip
        lines = [json.loads(x) for x in (folder / "r" / "generations.jsonl").open()]
        refused = "max_model_len=512" in (lines[0].get("error") or "")
        return done.returncode == 0 and refused and time.monotonic() - start < 120

    return [
        command_case("failed runs", "num_blocks=1: every request fails",
                     run_exits([*TINY_RUN, "num_blocks=1"], 1, every)),
        command_case("failed runs", "200 KB of random bytes as jsonl",
                     run_exits(jsonl(noise), 1, every)),
        command_case("failed runs", "one bad row of two: a warning",
                     run_exits(jsonl(b'{"prompt": "a"}\n{"x": 1}\n'), 0, "Warning: ")),
        command_case("jsonl rows", "rows after a blank line and a bad one", rows_after_a_blank),
        command_case("jsonl rows", "a 30 MB line, max_model_len=512", huge_line),
    ]  # fmt: skip


def check_cases(f: Folders) -> list[Case]:
    def refused(overrides: list[str]) -> Callable[[], bool]:
        def check() -> bool:
            folder = f.fresh()
            return one_line(command(folder, "pipeline", *overrides,
                                    f"hydra.run.dir={folder}/r"), 2)  # fmt: skip

        return check

    spec = [*PLAN_JOB, "workload.num_requests=2"]
    given = {
        "scheduler.max_tokens=8": [*TINY_RUN, "scheduler.max_tokens=8"],
        "num_threads=100000": [*TINY_RUN, "num_threads=100000"],
        "speculative.tokens=1000": [*spec, "speculative.method=ngram", "speculative.tokens=1000"],
        "disagg 1000 + 1000": [*spec, "disagg.prefill=1000", "disagg.decode=1000"],
    }
    cases = [command_case("start-up checks", name, refused(o)) for name, o in given.items()]

    def plan_without_slo() -> bool:
        folder = f.fresh()
        done = command(folder, "pipeline.plan", f"hydra.sweep.dir={folder}/p")
        said = [x for x in (done.stdout + done.stderr).splitlines() if x.strip()]
        return done.returncode == 2 and len(said) == 1 and said[0].startswith("Error: ")

    return [*cases, command_case("plan endings", "no SLO: one line", plan_without_slo)]


def resume_cases(f: Folders) -> list[Case]:
    def unended_last_line() -> bool:
        run = f.copy()
        generations = run / "generations.jsonl"
        generations.write_bytes(generations.read_bytes().removesuffix(b"\n"))
        kept = generations.read_bytes()
        done = command(run.parent, "pipeline", f"+resume={run}", f"hydra.run.dir={run}.r")
        metrics = json.loads((run / "metrics.json").read_text())
        last = kept.splitlines()[-1]  # the finished request: kept, not served again
        return (done.returncode == 0 and metrics.get("resumed_requests") == 0
                and last in generations.read_bytes().splitlines())  # fmt: skip

    def binary_generations() -> bool:
        run = f.copy()
        noise = random.Random(1).randbytes(4096)
        (run / "generations.jsonl").write_bytes(noise)
        done = command(run.parent, "pipeline", f"+resume={run}", f"hydra.run.dir={run}.r")
        return one_line(done, 2) and (run / "generations.jsonl").read_bytes() == noise

    return [
        command_case("resume", "a whole last line without its newline", unended_last_line),
        command_case("resume", "random bytes as generations.jsonl", binary_generations),
    ]


def command_cases(root: Path) -> list[Case]:
    f = Folders(root)
    return [*injection_cases(f), *link_cases(f), *damaged_cases(f), *run_cases(f),
            *check_cases(f), *resume_cases(f)]  # fmt: skip


# ------------------------------------------------------------------------ servers


def raw_answer(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(head)
        except OSError:
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
        return answer


def json_400(url: str, head: bytes) -> bool:
    auth = f"Authorization: {JSON['Authorization']}\r\nContent-Type: application/json\r\n"
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
               + auth.encode() + head)  # fmt: skip
    answer = raw_answer(url, request)
    head_part, _, body = answer.partition(b"\r\n\r\n")
    if not head_part.startswith(b"HTTP/1.1 400") or b"application/json" not in head_part:
        return False
    return "error" in json.loads(body)


def tiny_cases() -> list[Case]:
    def served(prompt: list) -> Callable[[str], bool]:  # special tokens: no text, still tokens
        body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
        return lambda url: post(url, body).json()["usage"]["completion_tokens"] == 2

    ids = [Case("token-id prompts", f"prompt={p}", served(p)) for p in ([256], [257, 258], [[256]])]

    def short(url: str, body: object = None, path: str = "") -> bool:
        if path:
            response = httpx.get(f"{url}{path}", headers=JSON, timeout=30)
        else:
            response = post(url, body)
        return 400 <= response.status_code < 500 and len(response.content) < 2000

    bias = {str(i): 1.0 for i in range(20_000)}

    def evil(url: str) -> bool:  # a page's own name, resolved to 127.0.0.1
        host = {"Host": f"evil.example:{url.rsplit(':', 1)[1]}"}
        return httpx.get(f"{url}/health", headers=host, timeout=10).status_code == 400

    raw = {"two Content-Length": b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
           "negative Content-Length": b"Content-Length: -1\r\n\r\n{}",
           "an unfinished 20 KB head": b"X-Big: " + b"a" * 20_000}  # fmt: skip
    return [
        *ids,
        Case(
            "echoes",
            "logit_bias of 20,000 entries",
            lambda url: short(url, {"prompt": "hi", "logit_bias": bias}),
        ),  # fmt: skip
        Case("echoes", "a 60 KB path", lambda url: short(url, path="/v1/" + "p" * 60_000)),
        Case("host", "Host: evil.example (DNS rebinding)", evil),
        *(Case("raw HTTP", name, lambda url, h=h: json_400(url, h)) for name, h in raw.items()),
    ]


def simulated_cases() -> list[Case]:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True}
    return [
        body_case(
            "logprobs (simulated)",
            "logprobs=5",
            {"prompt": "hi", "max_tokens": 3, "logprobs": 5},
            param="logprobs",
        ),  # fmt: skip
        body_case(
            "logprobs (simulated)",
            "logprobs=5, stream",
            {"prompt": "hi", "max_tokens": 3, "logprobs": 5, "stream": True},
            param="logprobs",
        ),  # fmt: skip
        body_case(
            "logprobs (simulated)",
            "chat logprobs",
            chat,
            param="logprobs",
            route="chat/completions",
        ),  # fmt: skip
    ]


def health_during_tokenize(url: str) -> bool:
    """/health answers while four /tokenize renders of the looping template run."""
    body = {"messages": [{"role": "user", "content": "hi"}]}
    ended: list[float] = []

    def tokenize() -> None:
        httpx.post(f"{url}/tokenize", json=body, headers=JSON, timeout=60)
        ended.append(time.monotonic())

    threads = [threading.Thread(target=tokenize) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    ok = healthy(url)
    answered = time.monotonic()
    for thread in threads:
        thread.join(60)
    return ok and len(ended) == 4 and answered < min(ended)
