"""What used to leave a server half alive, hang it, or write through a link; and commands
that ended in a traceback or a misleading line: each now ends cleanly, in one line."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline import inspect
from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine, check_config
from pipeline.run_folder import artefacts
from pipeline.run_folder.artefacts import GenerationWriter, RunFolderError, StepWriter
from pipeline.serve.__main__ import exit_code, listening_socket, prepare
from pipeline.serve.derived import kv_pool_blocks
from pipeline.serve.folder import GenerationAppender
from stages.loading.chat import render_chat
from stages.loading.checkpoint import read_spec
from stages.loading.tokenizer import ByteTokenizer
from tests.gguf_files import hf_weights, model_config, train_vocab, write_model
from tests.helpers import make_config
from tests.helpers_serve import live_server
from tests.test_inspect import folder_of

JSON = {"Content-Type": "application/json"}
SMALL = ["model=tiny", "max_num_seqs=4", "max_tokens=64"]


# 3: a full disk while serving.
def test_a_full_disk_ends_the_server_and_answers_every_open_request(tmp_path, monkeypatch):
    def full(self, request):
        with artefacts.writing(self.path):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(GenerationAppender, "__call__", full)
    with live_server(SMALL, tmp_path) as served:
        body = {"prompt": "hi", "max_tokens": 4}
        response = httpx.post(f"{served.url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 500 and "No space left" in response.text
        deadline = time.monotonic() + 10
        while not served.fatal and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(served.fatal[0], RunFolderError)  # the process exits with it
        health = httpx.get(f"{served.url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "failed"
        again = httpx.post(f"{served.url}/v1/completions", json=body, timeout=10)
        assert again.status_code == 503  # refused at once, never left waiting
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "failed"


def test_a_fatal_error_exits_1_with_one_line_even_where_metrics_cannot_be_written(tmp_path, capsys):
    assert exit_code(RuntimeError("boom"), tmp_path) == 1
    assert json.loads((tmp_path / "metrics.json").read_text())["error"] == "RuntimeError: boom"
    assert exit_code(ConfigError("bad"), tmp_path / "gone" / "deeper") == 2
    assert capsys.readouterr().err.splitlines()[-1] == "Error: bad"


# 4: serve and run warm the same graphs; a warmup error ends the server.
def test_a_server_with_warmup_warms_the_batch_runs_graphs():
    served = make_config([*SMALL, "warmup=true"])
    prepare(served, "tiny")
    engine, _ = build_engine(served)
    batch, _ = build_engine(make_config([*SMALL, "warmup=true"]))
    assert engine.warmup_shapes() == batch.warmup_shapes()
    assert engine.scheduler.kv_cache.num_blocks == batch.scheduler.kv_cache.num_blocks


@pytest.mark.slow  # it compiles every graph (half a minute on two cores)
def test_python_m_pipeline_serve_with_warmup_becomes_ready(tmp_path):
    with live_server(["model=tiny", "warmup=true"], tmp_path) as served:
        assert not served.fatal and served.worker.ready.is_set()
        assert httpx.get(f"{served.url}/health", timeout=5).json() == {"status": "ok"}


def test_a_warmup_beyond_its_limit_ends_the_server_with_the_error(tmp_path):
    overrides = [*SMALL, "warmup=true", "metadata.max_warmup_shapes=3"]
    with live_server(overrides, tmp_path) as served:
        assert isinstance(served.fatal[0], ConfigError)
        assert "metadata.max_warmup_shapes=3" in str(served.fatal[0])
        assert httpx.get(f"{served.url}/health", timeout=5).json()["status"] == "failed"


# 5: run-folder files through links.
@pytest.mark.parametrize("name", ["steps.jsonl", "generations.jsonl", "gen-serve"])
def test_no_run_file_is_written_through_a_symbolic_link(tmp_path, name):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    file = "generations.jsonl" if name == "gen-serve" else name
    (out / file).symlink_to(target)
    with pytest.raises(RunFolderError, match=r"is a symbolic link: .* remove it"):
        if name == "steps.jsonl":
            StepWriter(out)
        elif name == "generations.jsonl":
            GenerationWriter(out, ByteTokenizer(add_bos=True))
        else:
            GenerationAppender(out, ByteTokenizer(add_bos=True))
    assert target.read_text() == "keep me"


# 2: a chat template that would hang the server; and the model's own name.
HANG = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
GROW = "{% for i in range(100000) %}{% for j in range(100000) %}xx{% endfor %}{% endfor %}"


@pytest.mark.parametrize("template", [HANG, GROW])
def test_a_hostile_template_is_stopped_by_time_or_size(template):
    start = time.monotonic()
    with pytest.raises(ValueError, match="chat template"):
        render_chat(template, [{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 10
    assert render_chat("{{ messages[0].content }}", [{"role": "user", "content": "ok"}]) == "ok"


def hostile_gguf(path: Path) -> Path:
    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), False)
    rng = np.random.default_rng(0)
    weights = hf_weights(config, rng)
    write_model(path, config, weights, {}, vocab, rng, template=HANG, name="Tiny Hostile 1")
    return path


def test_a_gguf_template_that_loops_is_a_400_and_health_answers_meanwhile(tmp_path):
    path = hostile_gguf(tmp_path / "hostile.gguf")
    (tmp_path / "run").mkdir()
    overrides = ["model=gguf", f"model.path={path}", "max_model_len=256", "max_num_seqs=2"]
    with live_server(overrides, tmp_path / "run", choice="gguf") as served:
        models = httpx.get(f"{served.url}/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in models] == ["Tiny-Hostile-1"]  # general.name
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answers: list[httpx.Response] = []
        url = f"{served.url}/v1/chat/completions"
        chat = threading.Thread(
            target=lambda: answers.append(httpx.post(url, json=body, timeout=30))
        )
        chat.start()
        time.sleep(0.3)
        start = time.monotonic()
        assert httpx.get(f"{served.url}/health", timeout=5).status_code == 200
        assert time.monotonic() - start < 1  # not behind the render
        chat.join(30)
        error = answers[0].json()["error"]
        assert answers[0].status_code == 400 and error["param"] == "messages"
        assert "did not finish within" in error["message"]
        assert httpx.get(f"{served.url}/health", timeout=5).status_code == 200


def test_a_gguf_model_without_general_name_is_named_by_its_file(tmp_path):
    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), False)
    rng = np.random.default_rng(0)
    path = tmp_path / "my-model-q8.gguf"
    write_model(path, config, hf_weights(config, rng), {}, vocab, rng)
    cfg = make_config(["model=gguf", f"model.path={path}", "max_model_len=256"])
    prepare(cfg, "gguf")
    assert cfg.serve.model_name == "my-model-q8"
    named = make_config(["model=gguf", f"model.path={path}", "max_model_len=256",
                         "serve.model_name=mine"])  # fmt: skip
    prepare(named, "gguf")
    assert named.serve.model_name == "mine"


# The KV pool from a memory budget.
def test_the_server_kv_pool_is_sized_by_its_memory_budget():
    cfg = make_config(["model=tiny", "max_model_len=256", "serve.kv_cache_memory_gb=0.001"])
    blocks, line = kv_pool_blocks(cfg)
    per_token = 4 * 2 * 2 * 32 * 4  # layers x (k, v) x kv heads x head_dim x fp32
    assert blocks == (2**30 // 1000) // (16 * per_token) and "serve.kv_cache_memory_gb" in line
    whole = make_config(["model=tiny", "max_model_len=256", "serve.kv_cache_memory_gb=100"])
    assert kv_pool_blocks(whole)[0] == 8 * 16  # never more than max_num_seqs full requests
    short = make_config(["model=tiny", "max_model_len=256", "serve.kv_cache_memory_gb=1e-6"])
    with pytest.raises(ConfigError, match="raise serve.kv_cache_memory_gb"):
        kv_pool_blocks(short)


# 13: a port in use; a server's folder resumed.
def test_a_port_in_use_is_one_line_before_anything_says_serving():
    first = listening_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    first.listen()
    try:
        with pytest.raises(ConfigError, match=rf"serve.port={port} cannot be bound"):
            listening_socket("127.0.0.1", port)
    finally:
        first.close()


# 8, 9, 14: bounds before work; commands that ended in tracebacks.
def test_a_billion_layers_is_refused_before_any_weight_plan(tmp_path, capsys):
    folder = folder_of(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))
    start = time.monotonic()
    assert inspect.main([str(folder), "--json"]) == 1
    assert time.monotonic() - start < 5
    assert (
        "num_hidden_layers=1000000000 is out of range"
        in json.loads(capsys.readouterr().out)["reason"]
    )
    with pytest.raises(ValueError, match="at most 4,096"):
        read_spec({**config, "num_hidden_layers": 10**9})


@pytest.mark.parametrize("tp", [0, -1, 100000])
def test_a_tensor_parallel_degree_out_of_range_is_one_config_error(tp):
    cfg = make_config(
        ["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b", f"tp={tp}"]
    )
    with pytest.raises(ConfigError, match=rf"^tp={tp}: the tensor-parallel degree"):
        check_config(cfg)


@pytest.mark.parametrize("path", ["/proc/self/mem", "/dev/null", "/etc/hostname"])
def test_inspect_on_a_file_that_is_not_gguf_says_so_in_one_line(path, capsys):
    assert inspect.main([path]) == inspect.NOT_A_MODEL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file but not a GGUF file" in err


def test_a_gguf_vocabulary_shorter_than_its_merges_is_one_config_error(tmp_path, monkeypatch):
    import tests.gguf_files as files

    def short_vocab(writer, tokenizer, pre="smollm", template=files.CHATML):
        model = json.loads(tokenizer.to_str())["model"]
        tokens = sorted(model["vocab"], key=model["vocab"].get)[:40]
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)

    monkeypatch.setattr(files, "add_gpt2_vocab", short_vocab)
    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), False)
    rng = np.random.default_rng(0)
    path = tmp_path / "short.gguf"
    write_model(path, config, hf_weights(config, rng), {}, vocab, rng)
    cfg = make_config(["model=gguf", f"model.path={path}", "max_model_len=256"])
    with pytest.raises(ConfigError, match="its vocabulary cannot be built .* use another file"):
        build_engine(cfg)


def test_a_gguf_block_count_of_a_billion_is_refused_at_once(tmp_path, capsys):
    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), False)
    rng = np.random.default_rng(0)
    path = tmp_path / "deep.gguf"
    header = {**config, "num_hidden_layers": 10**9}  # two layers' tensors, a billion named
    write_model(path, header, hf_weights(config, rng), {}, vocab, rng)
    start = time.monotonic()
    assert inspect.main([str(path), "--json"]) == 1
    assert time.monotonic() - start < 5
    assert (
        "num_hidden_layers=1000000000 is out of range"
        in json.loads(capsys.readouterr().out)["reason"]
    )


@pytest.mark.slow  # starts the command several times
@pytest.mark.parametrize("delay_s", [1.5, 3.0, 4.5])
def test_sigterm_while_the_server_loads_ends_it_without_a_cpp_stack(tmp_path, delay_s):
    import signal
    import subprocess
    import sys

    free = listening_socket("127.0.0.1", 0)
    port = free.getsockname()[1]
    free.close()
    command = [sys.executable, "-m", "pipeline.serve", "model=tiny", f"serve.port={port}",
               f"hydra.run.dir={tmp_path}"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0].decode()
    assert "C++ Traceback" not in out and "Traceback" not in out
    assert proc.returncode in (0, 143, -signal.SIGTERM)


def test_a_servers_folder_is_not_resumed_as_a_batch_run(tmp_path):
    import yaml
    from omegaconf import OmegaConf

    from pipeline.run_folder.resume import load_previous

    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(make_config(SMALL), tmp_path / ".hydra" / "config.yaml")
    choices = {"model": "tiny", "hydra/help": "serve"}
    hydra = {"hydra": {"runtime": {"choices": choices}}}
    (tmp_path / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    with pytest.raises(ConfigError, match="is a server's folder .* start the server again"):
        load_previous(tmp_path)


@pytest.mark.slow  # the plan command in a subprocess
def test_a_plan_whose_every_job_failed_exits_1_and_says_so(tmp_path):
    from tests.helpers import run_cli

    result = run_cli(tmp_path, "pipeline.plan", "hardware=gaudi3", "model=spec/llama31_8b",
                     "tp=0", "max_tokens=2048", "max_num_seqs=64", "slo.ttft_ms=500",
                     f"hydra.sweep.dir={tmp_path / 'plan'}")  # fmt: skip
    assert result.returncode == 1
    assert "Error: every job of the plan failed (job 0: tp=0: the tensor-parallel" in result.stdout
    assert "No configuration met the SLO" not in result.stdout
