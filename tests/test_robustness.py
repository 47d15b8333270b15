"""Nothing lost, nothing hangs: bad jsonl lines are that line's error, impossible sizes are
refused at start with one line, and the run folder is written as the run goes."""

from __future__ import annotations

import codecs
import errno
import json
import os
import signal
import tempfile
import time

import pytest

from pipeline.config.checks import ConfigError, check_memory, memory_estimate
from pipeline.executors import check_config
from pipeline.executors.build import build
from pipeline.job.run import run
from pipeline.job.signals import RunInterrupted
from pipeline.run_folder import artefacts
from pipeline.run_folder.records import StepRecord
from pipeline.schema import JsonlWorkloadConf
from stages.loading.tokenizer import ByteTokenizer
from stages.workload import JsonlWorkload
from tests.helpers import make_config, schema_kwargs

# ------------------------------------------------------------------------------- jsonl


def load(tmp_path, data: bytes, **kwargs) -> list:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    return JsonlWorkload(**schema_kwargs(JsonlWorkloadConf, path=str(path), **kwargs)).load(
        ByteTokenizer(add_bos=True)
    )


def lines(*rows: dict) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


def test_non_utf8_bytes_spoil_only_their_line(tmp_path):
    data = lines({"id": "a", "prompt": "fine"}) + b'{"prompt": "bad \xff\xfe"}\n'
    data += lines({"id": "c", "prompt": "also fine"})
    got = load(tmp_path, data)
    assert [r.id for r in got] == ["a", "line-2", "c"]
    assert got[0].error is None and got[2].error is None
    assert "line 2" in got[1].error and "not UTF-8" in got[1].error


def test_a_byte_order_mark_is_read_past(tmp_path):
    got = load(tmp_path, codecs.BOM_UTF8 + lines({"id": "a", "prompt": "hi"}))
    assert got[0].error is None and got[0].prompt == "hi"


def test_line_and_paragraph_separators_stay_in_the_prompt(tmp_path):
    prompt = "one\u2028two\u2029three\x0cfour\x1cfive\x85six"
    got = load(tmp_path, lines({"id": "a", "prompt": prompt}, {"id": "b", "prompt": "x"}))
    assert [r.id for r in got] == ["a", "b"]
    assert got[0].error is None and got[0].prompt == prompt


def test_crlf_line_ends_are_read(tmp_path):
    got = load(tmp_path, b'{"id": "a", "prompt": "hi"}\r\n{"id": "b", "prompt": "yo"}\r\n')
    assert [(r.id, r.prompt, r.error) for r in got] == [("a", "hi", None), ("b", "yo", None)]


def test_a_repeated_id_is_the_second_lines_error(tmp_path):
    got = load(tmp_path, lines({"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}))
    assert got[0].error is None and got[0].id == "x"
    assert got[1].id == "line-2" and "id 'x' is already line 1's" in got[1].error


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"prompt": "a", "arrival_s": 1e9}', "must be within 0 and 86400 s"),
        (b'{"prompt": "a", "arrival_s": NaN}', "must be within 0 and 86400 s"),
        (b'{"prompt": "a", "arrival_s": Infinity}', "must be within 0 and 86400 s"),
        (b'{"prompt": "a", "arrival_s": -1}', "must be within 0 and 86400 s"),
        (b'{"prompt": "a", "arrival_s": true}', "'arrival_s' must be a number"),
        (b'{"prompt": "a", "ignore_eos": "false"}', "'ignore_eos' must be true or false"),
        (b'{"prompt": "a", "top_k": 100000000000000000000}', "'top_k'=1"),
        (b'{"prompt": "a", "id": [1]}', "'id' must be a string or an integer"),
        (b"[" * 100_000, "nested too deeply"),
    ],
    ids=[
        "arrival-1e9",
        "arrival-nan",
        "arrival-inf",
        "arrival-negative",
        "arrival-bool",
        "ignore-eos-string",
        "huge-top-k",
        "id-list",
        "deep-nesting",
    ],  # fmt: skip
)
def test_bad_values_are_that_lines_error(tmp_path, raw, message):
    got = load(tmp_path, raw + b"\n" + lines({"id": "ok", "prompt": "fine"}))
    assert message in got[0].error and got[0].finish_reason == "error"
    assert got[1].error is None


def test_ignore_eos_takes_a_json_boolean(tmp_path):
    got = load(
        tmp_path, lines({"prompt": "a", "ignore_eos": False}, {"prompt": "b", "ignore_eos": True})
    )
    assert [r.ignore_eos for r in got] == [False, True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_requests": -1}, "workload.num_requests=-1"),
        ({"rate": -1.0}, "workload.rate=-1.0"),
        ({"rate": float("nan")}, "workload.rate=nan"),
    ],
)
def test_jsonl_workload_keys_are_checked(tmp_path, kwargs, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match=message):
        JsonlWorkload(**schema_kwargs(JsonlWorkloadConf, path=str(path), **kwargs))


# ------------------------------------------------------------------------------ bounds

GIB = 2**30


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["max_num_seqs=1000000000", "max_tokens=1000000000"], "bucket tables"),
        (["num_blocks=1000000000"], "KV cache"),
        (["max_model_len=1000000000"], "rotary table"),
        (["workload.num_requests=1000000000"], "above the limit of 1000000 requests"),
        (["workload.num_requests=-1"], "workload.num_requests must be >= 1"),
        (["workload.rate=-1"], "workload.rate >= 0"),
        (["workload.rate=1e-9"], "more than a day"),
        (["workload.start_s=1e9"], "workload.start_s=1000000000.0: must be within 0 and 86400"),
        (["workload.rate=nan"], "workload.rate=nan: must be a finite number"),
    ],
)
def test_impossible_sizes_are_refused_at_start(overrides, message):
    cfg = make_config(overrides)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
        build(cfg.workload)  # the synthetic workload's own checks come when it is built
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_kv_estimate_is_the_pool_formula():
    cfg = make_config(["num_blocks=10"])  # tiny: 4 layers, 2 kv heads of 32 dims, fp32
    assert memory_estimate(cfg, 10)["KV cache"] == 11 * 16 * 4 * 2 * 32 * 2 * 4  # + scratch


def test_memory_is_checked_against_what_is_available():
    cfg = make_config(["num_blocks=200000", "block_size=128"])
    need = sum(memory_estimate(cfg, 200_000).values())
    assert need > 40 * GIB
    with pytest.raises(
        ConfigError, match=r"need about 48.\d GiB .* has 8 GiB available: lower num"
    ):
        check_memory(cfg, 200_000, available=8 * GIB)
    check_memory(cfg, 200_000, available=need + 1)  # fits: no error


def test_a_checkpoint_claiming_huge_layers_is_refused_before_loading(tmp_path):
    from tests.test_checkpoint import good_folder

    folder, _ = good_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    cfg = make_config(["model=hf", f"model.path={folder}", "max_model_len=256"])
    for layers, message in [
        (10**5, r"num_hidden_layers=100000 is out of range \(at most 4,096"),
        (4000, "weights"),
    ]:
        config["num_hidden_layers"] = layers
        config["hidden_size"] = config["intermediate_size"] = 8192  # 4000 x 0.9 GB
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(ConfigError, match=message):
            check_config(cfg)


def test_a_fifo_for_weights_is_refused_without_opening_it(tmp_path):
    from tests.test_checkpoint import good_folder

    folder, _ = good_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")  # opening it would block for ever
    cfg = make_config(["model=hf", f"model.path={folder}", "max_model_len=256"])
    with pytest.raises(ConfigError, match="model.safetensors is not a regular file"):
        check_config(cfg)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"eos_token_id": 99}, "eos_token_id 99 is outside the vocabulary (vocab_size=40"),
        ({"eos_token_id": [2, 40]}, "eos_token_id 40 is outside the vocabulary"),
        ({"pad_token_id": -1}, "pad_token_id -1 is outside the vocabulary"),
        ({"eos_token_id": "2"}, "config.json eos_token_id='2' must be a token id (an integer)"),
        ({"eos_token_id": [2, "3"]}, "eos_token_id=[2, '3'] must be a token id"),
    ],
)
def test_special_ids_must_be_integers_in_the_vocabulary(tmp_path, change, message):
    from stages.loading.checkpoint import load_hf_model
    from tests.test_checkpoint import good_folder

    folder, _ = good_folder(tmp_path, **change)
    with pytest.raises(ValueError) as err:
        load_hf_model(str(folder), "float32", max_position=0)
    assert message in str(err.value)


# -------------------------------------------------------------------------- run folder


def test_run_folder_problems_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    assert "is under" in artefacts.run_folder_problem(tmp_path / "file" / "run")
    (tmp_path / "run" / "generations.jsonl").mkdir(parents=True)
    problem = artefacts.run_folder_problem(tmp_path / "run")
    assert "generations.jsonl is not a regular file" in problem
    assert artefacts.run_folder_problem(tmp_path / "fresh" / "deeper") is None
    assert not (tmp_path / "fresh").exists()  # checking creates nothing

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert "cannot be written" in artefacts.run_folder_problem(tmp_path / "fresh")
    assert "Read-only file system" in artefacts.run_folder_problem(tmp_path / "fresh")


def record(step: int) -> StepRecord:
    return StepRecord(step, "decode", [], ["a"], [], 1, 1, "(1, 1)", 0.01)


def test_steps_are_on_disk_as_they_happen(tmp_path):
    """A step is on disk within StepWriter.FLUSH_S of the next one being written."""
    writer = artefacts.StepWriter(tmp_path)
    writer(record(0))
    on_disk = (tmp_path / "steps.jsonl").read_text().splitlines()  # before close
    assert [json.loads(line)["step"] for line in on_disk] == [0]
    time.sleep(writer.FLUSH_S * 1.5)
    writer(record(1))
    on_disk = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in on_disk] == [0, 1]
    writer.close()


def small_run(tmp_path, *overrides: str):
    cfg = make_config(["workload.num_requests=6", "max_num_seqs=2", *overrides])
    return cfg, tmp_path


def test_generations_are_on_disk_as_requests_finish(tmp_path, monkeypatch):
    seen: list[int] = []

    def watch(self, record):  # each step: what finished so far is already in the file
        seen.append(len(artefacts.read_generations(tmp_path / "generations.jsonl")))
        original(self, record)

    original = artefacts.StepWriter.__call__
    monkeypatch.setattr(artefacts.StepWriter, "__call__", watch)
    cfg, out = small_run(tmp_path)
    run(cfg, out)
    assert seen[0] == 0 and 0 < max(seen[:-1]) < 6  # lines appeared during the run
    final = [json.loads(line) for line in (tmp_path / "generations.jsonl").open()]
    assert [g["index"] for g in final] == list(range(6))  # rewritten in workload order


def test_a_full_disk_stops_the_run_with_the_path_and_keeps_what_was_written(tmp_path, monkeypatch):
    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

        def close(self):
            pass

    original = artefacts.GenerationWriter._append

    def append(self, line):
        if len(self.lines) == 2:
            self._file.close()
            self._file = FullDisk()
        original(self, line)

    monkeypatch.setattr(artefacts.GenerationWriter, "_append", append)
    cfg, out = small_run(tmp_path)
    with pytest.raises(artefacts.RunFolderError) as err:
        run(cfg, out)
    assert str(err.value) == f"cannot write {tmp_path}/generations.jsonl: No space left on device"
    kept = artefacts.read_generations(tmp_path / "generations.jsonl")
    assert len(kept) == 2 and all(g["finish_reason"] == "length" for g in kept)


def test_sigterm_leaves_an_interrupted_folder_with_real_figures(tmp_path, monkeypatch):
    original = artefacts.StepWriter.__call__

    def term_at_step_6(self, record):
        original(self, record)
        if record.step == 6:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(artefacts.StepWriter, "__call__", term_at_step_6)
    cfg, out = small_run(tmp_path, "workload.min_new_tokens=8", "workload.max_new_tokens=10")
    with pytest.raises(RunInterrupted) as err:
        run(cfg, out)
    assert err.value.exit_code == 143 and err.value.recorded
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers put back
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "interrupted" and metrics["num_requests"] == 6
    assert metrics["output_tokens"] > 0 and metrics["duration_s"] > 0
    assert metrics["output_throughput"] == pytest.approx(
        metrics["output_tokens"] / metrics["duration_s"]
    )
    final = [json.loads(line) for line in (tmp_path / "generations.jsonl").open()]
    assert [g["index"] for g in final] == list(range(6))
    stopped = [g for g in final if g["error"] == artefacts.INTERRUPTED]
    assert stopped
    for g in final:
        if g["ttft_s"] is not None:
            assert g["e2e_s"] >= g["ttft_s"]
